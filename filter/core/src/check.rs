//! One limit to decide for one request, as every part after the planner sees it: the
//! bridge's call, the decision, the response's headers, the metering, the engine's parts. Its
//! [`Mode`] is one value, chosen once by the planner ([`Mode::of`]).

use std::rc::Rc;

use crate::config::{Algorithm, Lease, OverBudget, Window};

/// One limit to decide for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitCheck {
    /// Index of the rule in the config, and of the limit in the rule.
    pub rule: usize,
    pub limit: usize,
    /// Shared with the worker's plan memo: a returning identity's key is not copied.
    pub key: Rc<str>,
    pub algorithm: Algorithm,
    /// Units per window (the script's `limit`).
    pub per_window: u64,
    /// What headers call the limit: the burst for buckets, `per_window` for windows.
    pub quota: u64,
    /// Its window: a length in ms (the script's hot path), or a calendar window.
    pub window: Window,
    pub burst: u64,
    pub cost: u64,
    pub mode: Mode,
    /// The script reads the identity's override of this limit (`"overrides": true`).
    pub overrides: bool,
}

/// How the script decides a limit (see `lua/decide.lua`).
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Decided and enforced; with the rule's key budget, if it has one.
    Enforce { budget: Option<Rc<BudgetCheck>> },
    /// Decided and reported, never refusing (a shadow rule); with the rule's key budget, if
    /// it has one.
    Shadow { budget: Option<Rc<BudgetCheck>> },
    /// Enforced, and its units may be leased ahead: a request may ask for more than itself.
    Lease(Lease),
    /// A usage limit admitting in mode `after`: allowed while at least 1 unit is left and
    /// charged nothing up front; `cost` is then its estimate, charged when its usage cannot
    /// be read.
    After,
    /// A concurrency limit as planned: the request is to take a hold. It has no id until the
    /// engine admits the request ([`Mode::admitted`]), which turns it into [`Mode::Hold`].
    ToHold,
    /// A concurrency limit of an admitted request: it has a hold, named by this id (its
    /// worker's and its stream's), until its stream ends.
    Hold(Rc<str>),
}

impl Mode {
    /// The mode of a limit, by the one precedence there is: a usage limit in mode `after` is
    /// that (the script then enforces it, also in a shadow rule); else a lease, which the
    /// configuration allows only outside shadow rules and rules with a key budget; else
    /// shadow or enforced, with the key budget.
    pub fn of(
        after: bool,
        lease: Option<Lease>,
        shadow: bool,
        budget: Option<Rc<BudgetCheck>>,
    ) -> Mode {
        match (after, lease, shadow) {
            (true, _, _) => Mode::After,
            (false, Some(lease), false) if budget.is_none() => Mode::Lease(lease),
            (false, _, true) => Mode::Shadow { budget },
            (false, _, false) => Mode::Enforce { budget },
        }
    }

    /// It never refuses a request (it may say it would).
    pub fn is_shadow(&self) -> bool {
        matches!(self, Mode::Shadow { .. })
    }

    /// Its lease, if its units may be leased.
    pub fn lease(&self) -> Option<Lease> {
        match self {
            Mode::Lease(lease) => Some(*lease),
            _ => None,
        }
    }

    /// A concurrency limit, admitted or not: the request takes a hold while it runs.
    pub fn takes_hold(&self) -> bool {
        matches!(self, Mode::ToHold | Mode::Hold(_))
    }

    /// The mode once its request is admitted with `id`: a hold to take gets the id it is named
    /// by; every other mode stays.
    pub fn admitted(&mut self, id: &Rc<str>) {
        if *self == Mode::ToHold {
            *self = Mode::Hold(id.clone());
        }
    }

    /// The key budget it is decided with, if any.
    pub fn budget(&self) -> Option<&Rc<BudgetCheck>> {
        match self {
            Mode::Enforce { budget } | Mode::Shadow { budget } => budget.as_ref(),
            Mode::Lease(_) | Mode::After | Mode::ToHold | Mode::Hold(_) => None,
        }
    }
}

/// What the script needs to apply a rule's key budget to one of its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetCheck {
    /// Counts the rule's new identities (one key per rule).
    pub counter_key: String,
    /// This limit's state for every new identity over the budget (over_budget `shared`).
    pub overflow_key: String,
    pub new_keys: u64,
    pub window_ms: u64,
    pub over_budget: OverBudget,
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn one_precedence_chooses_the_mode() {
        let lease = Lease {
            max_units: 10,
            fraction: 0.5,
            max_ms: 1000,
        };
        let budget = Some(Rc::new(BudgetCheck {
            counter_key: "c".into(),
            overflow_key: "o".into(),
            new_keys: 1,
            window_ms: 1000,
            over_budget: OverBudget::Shared,
        }));
        assert_eq!(Mode::of(true, Some(lease), true, None), Mode::After);
        assert_eq!(
            Mode::of(false, Some(lease), false, None),
            Mode::Lease(lease)
        );
        assert!(Mode::of(false, Some(lease), true, None).is_shadow());
        let enforced = Mode::of(false, Some(lease), false, budget.clone());
        assert_eq!(
            enforced,
            Mode::Enforce {
                budget: budget.clone()
            }
        );
        assert_eq!(enforced.budget(), budget.as_ref());
        assert_eq!(enforced.lease(), None);
        assert_eq!(
            Mode::of(false, None, false, None),
            Mode::Enforce { budget: None }
        );
    }

    #[test]
    fn a_hold_to_take_gets_its_id_when_admitted_and_no_other_mode_changes() {
        let id: Rc<str> = Rc::from("0000000000000001-7");
        let mut planned = Mode::ToHold;
        assert!(planned.takes_hold());
        planned.admitted(&id);
        assert_eq!(planned, Mode::Hold(id.clone()));
        assert!(planned.takes_hold());
        // Admitted once: a second id does not rename the hold.
        planned.admitted(&Rc::from("other"));
        assert_eq!(planned, Mode::Hold(id.clone()));
        let mut enforced = Mode::Enforce { budget: None };
        enforced.admitted(&id);
        assert_eq!(enforced, Mode::Enforce { budget: None });
        assert!(!enforced.takes_hold() && !Mode::After.takes_hold());
    }
}
