//! The median of a figure over the rounds of one run, with its range: what the report quotes
//! instead of one measurement, so that a slowdown during one round moves the range, not the
//! figure.

/// A figure measured once per round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spread {
    /// One value per round, in the order the rounds ran.
    pub rounds: Vec<f64>,
}

impl Spread {
    pub fn new(rounds: Vec<f64>) -> Spread {
        Spread { rounds }
    }

    /// The middle value; with an even count, the mean of the two middle ones. NaN when empty.
    pub fn median(&self) -> f64 {
        median(&self.rounds)
    }

    pub fn min(&self) -> f64 {
        self.rounds.iter().copied().fold(f64::NAN, f64::min)
    }

    pub fn max(&self) -> f64 {
        self.rounds.iter().copied().fold(f64::NAN, f64::max)
    }

    pub fn is_empty(&self) -> bool {
        self.rounds.is_empty()
    }

    /// `0.61 (0.58–0.63)`: the median and the range, 2 decimals.
    pub fn cell(&self) -> String {
        if self.is_empty() {
            return "–".into();
        }
        format!("{:.2} ({:.2}–{:.2})", self.median(), self.min(), self.max())
    }

    /// The median and the range, each written by `f`: `72.1 (63.0–77.4)`.
    pub fn cell_with(&self, f: impl Fn(f64) -> String) -> String {
        if self.is_empty() {
            return "–".into();
        }
        format!("{} ({}–{})", f(self.median()), f(self.min()), f(self.max()))
    }

    /// `{"median", "min", "max", "rounds"}` for results.json.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "median": self.median(), "min": self.min(), "max": self.max(), "rounds": self.rounds,
        })
    }
}

/// The median of `values` (NaN when empty); NaNs sort last.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_round_whatever_the_order() {
        let s = Spread::new(vec![0.9, 0.5, 0.7]);
        assert_eq!(s.median(), 0.7);
        assert_eq!((s.min(), s.max()), (0.5, 0.9));
        // One disturbed round moves the range, not the median.
        let disturbed = Spread::new(vec![0.70, 0.71, 0.30, 0.72, 0.69]);
        assert_eq!(disturbed.median(), 0.70);
        assert_eq!((disturbed.min(), disturbed.max()), (0.30, 0.72));
        assert_eq!(disturbed.cell(), "0.70 (0.30–0.72)");
    }

    #[test]
    fn an_even_count_takes_the_mean_of_the_two_middle_values() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[5.0]), 5.0);
        assert!(median(&[]).is_nan());
        assert_eq!(Spread::default().cell(), "–");
        let s = Spread::new(vec![72.14, 63.0, 77.44]);
        assert_eq!(s.cell_with(|v| format!("{v:.1}")), "72.1 (63.0–77.4)");
        assert_eq!(Spread::default().cell_with(|v| format!("{v:.1}")), "–");
    }

    #[test]
    fn the_json_holds_every_round_beside_the_median_and_range() {
        let j = Spread::new(vec![3.0, 1.0, 2.0]).json();
        assert_eq!(j["median"], 2.0);
        assert_eq!(j["min"], 1.0);
        assert_eq!(j["max"], 3.0);
        assert_eq!(j["rounds"], serde_json::json!([3.0, 1.0, 2.0]));
    }
}
