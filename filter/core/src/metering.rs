//! Reading one response's usage for the usage limits its request was let through on, and
//! what each limit is then settled: a stream's [`UsageMeter`], made by the engine when the
//! request is let through, fed by the adapter with the response's headers and body chunks as
//! they pass (never holding them), finished at the end of the stream (or when it ended early).

pub use crate::bounds::MAX_USAGE_BODY;
use crate::check::LimitCheck;
use crate::config::{UsageSource, MAX_USAGE};
use crate::decision::Settlement;
use crate::usage::{body_kind, usage_from_header, BodyKind, UsageRead, UsageReader};

#[derive(Debug)]
struct Metered {
    check: LimitCheck,
    /// What was charged before the request went upstream (0: `after`, or let through by the
    /// failure policy).
    reserved: u64,
    source: UsageSource,
    /// The response body's reader, once the response headers said what the body is.
    reader: Option<UsageReader>,
    read: Option<UsageRead>,
}

/// The usage limits of one stream and what their response said so far.
#[derive(Debug, Default)]
pub struct UsageMeter {
    limits: Vec<Metered>,
}

/// What one usage limit of a response comes to: its settlement (None: nothing to change)
/// and the units for the stats.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageCharge {
    pub check: LimitCheck,
    pub reserved: u64,
    /// The units the response is charged in the end: its usage, or the estimate when the
    /// usage could not be read.
    pub charged: u64,
    /// None when the usage was read.
    pub unread: Option<&'static str>,
}

impl UsageCharge {
    /// The signed change to send to Redis.
    pub fn settlement(&self) -> Option<Settlement> {
        let delta = i128::from(self.charged) - i128::from(self.reserved);
        let delta = i64::try_from(delta).ok().filter(|d| *d != 0)?;
        Some(Settlement {
            check: self.check.clone(),
            delta,
        })
    }

    /// Units charged above the estimate.
    pub fn debt(&self) -> u64 {
        self.charged.saturating_sub(self.check.cost)
    }

    /// Reserved units given back.
    pub fn given_back(&self) -> u64 {
        self.reserved.saturating_sub(self.charged)
    }
}

impl UsageMeter {
    pub(crate) fn add(&mut self, check: LimitCheck, reserved: u64, source: UsageSource) {
        self.limits.push(Metered {
            check,
            reserved,
            source,
            reader: None,
            read: None,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// The response headers: `header(name)` gives a header's value (lower-case name).
    /// Header sources are read now; body sources start a reader if the content type is one
    /// the usage can be read from.
    pub fn on_headers(&mut self, header: &dyn Fn(&str) -> Option<Vec<u8>>) {
        let kind = header("content-type").and_then(|v| body_kind(&v));
        for m in &mut self.limits {
            match &m.source {
                UsageSource::Header(name) => {
                    m.read = Some(match header(name) {
                        Some(value) => usage_from_header(&value),
                        None => UsageRead::Missing,
                    });
                }
                UsageSource::Body(usage) => match kind {
                    Some(kind) => m.reader = Some(UsageReader::of(kind, usage, MAX_USAGE_BODY)),
                    None => m.read = Some(UsageRead::Missing),
                },
            }
        }
    }

    /// Whether body chunks are still wanted.
    pub fn wants_body(&self) -> bool {
        self.limits
            .iter()
            .any(|m| m.reader.as_ref().is_some_and(|r| !r.done()))
    }

    /// The body's kind, if a body is read (for logs and tests).
    pub fn body_kind(content_type: &[u8]) -> Option<BodyKind> {
        body_kind(content_type)
    }

    /// A chunk of the response body, as it passes.
    pub fn feed(&mut self, chunk: &[u8]) {
        for m in &mut self.limits {
            if let Some(reader) = m.reader.as_mut().filter(|r| !r.done()) {
                reader.feed(chunk);
            }
        }
    }

    /// The stream ended (`complete`: the body's end was seen; false: it ended early, its
    /// usage is what was read so far). Each limit's outcome.
    pub fn finish(self, complete: bool) -> Vec<UsageCharge> {
        self.limits
            .into_iter()
            .map(|mut m| {
                let read = match (m.read, m.reader.as_mut()) {
                    (Some(read), _) => read,
                    (None, Some(reader)) => reader.finish(complete),
                    // No response headers came (the stream ended before them).
                    (None, None) => UsageRead::Missing,
                };
                let (charged, unread) = match read {
                    UsageRead::Found(n) if n <= MAX_USAGE => (n, None),
                    UsageRead::Found(_) => (m.check.cost, Some("too_large")),
                    UsageRead::Missing => (m.check.cost, Some("missing")),
                    UsageRead::Invalid(why) => (m.check.cost, Some(why.name())),
                };
                UsageCharge {
                    check: m.check,
                    reserved: m.reserved,
                    charged,
                    unread,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::plan::token_bucket_check;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn meter(reserved: u64, source: UsageSource) -> UsageMeter {
        let mut m = UsageMeter::default();
        let check = LimitCheck {
            cost: 100,
            ..token_bucket_check("k")
        };
        m.add(check, reserved, source);
        m
    }

    fn headers<'a>(list: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<Vec<u8>> + 'a {
        move |name| {
            list.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_bytes().to_vec())
        }
    }

    fn body() -> UsageSource {
        UsageSource::Body(crate::usage::BodyUsage::first_of(vec![vec![
            "usage".into(),
            "total_tokens".into(),
        ]]))
    }

    #[test]
    fn a_json_usage_below_the_reservation_gives_back_the_rest() {
        let mut m = meter(100, body());
        m.on_headers(&headers(&[("content-type", "application/json")]));
        assert!(m.wants_body());
        m.feed(br#"{"usage": {"total_"#);
        m.feed(br#"tokens": 30}}"#);
        let out = m.finish(true);
        assert_eq!((out[0].charged, out[0].unread), (30, None));
        assert_eq!(out[0].settlement().map(|s| s.delta), Some(-70));
        assert_eq!((out[0].given_back(), out[0].debt()), (70, 0));
    }

    #[test]
    fn a_usage_above_the_estimate_is_debt() {
        let mut m = meter(100, UsageSource::Header("x-usage".into()));
        m.on_headers(&headers(&[("x-usage", "250")]));
        assert!(!m.wants_body());
        let out = m.finish(true);
        assert_eq!(out[0].settlement().map(|s| s.delta), Some(150));
        assert_eq!(out[0].debt(), 150);
    }

    #[test]
    fn an_unreadable_usage_keeps_the_reservation_or_charges_the_estimate() {
        for (reserved, want) in [(100, None), (0, Some(100))] {
            let mut m = meter(reserved, body());
            m.on_headers(&headers(&[("content-type", "application/json")]));
            m.feed(b"not json");
            let out = m.finish(true);
            assert_eq!(out[0].unread, Some("not_json"));
            assert_eq!(out[0].settlement().map(|s| s.delta), want);
        }
        // A body the usage cannot be read from (its type), and a stream that ended before
        // its response headers.
        let mut m = meter(0, body());
        m.on_headers(&headers(&[("content-type", "text/html")]));
        assert_eq!(m.finish(true)[0].charged, 100);
        let m = meter(0, body());
        assert_eq!(m.finish(false)[0].unread, Some("missing"));
    }

    #[test]
    fn a_stream_cut_early_settles_what_it_read() {
        let mut m = meter(100, body());
        m.on_headers(&headers(&[("content-type", "text/event-stream")]));
        m.feed(b"data: {\"usage\": {\"total_tokens\": 40}}\n\ndata: {\"choi");
        let out = m.finish(false);
        assert_eq!(out[0].charged, 40);
    }
}
