//! Reading one response's usage for the usage limits its request was let through on, and
//! what each limit is then settled: a stream's [`UsageMeter`], made by the engine when the
//! request is let through, fed by the adapter with the response's headers and body chunks as
//! they pass (never holding them), finished at the end of the stream (or when it ended early).

pub use crate::bounds::MAX_USAGE_BODY;
use crate::check::LimitCheck;
use crate::config::{UsageSource, MAX_USAGE};
use crate::decision::Settlement;
use crate::usage::{
    body_kind, encoding, usage_from_header, BodyKind, Encoding, InflateError, Inflater, UsageRead,
    UsageReader,
};

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
    /// A compressed body: what its readers read is inflated first (one inflater for all the
    /// limits), or why it cannot be read (an encoding other than gzip and deflate).
    body: BodyCoding,
}

#[derive(Debug, Default)]
enum BodyCoding {
    #[default]
    Plain,
    Inflate(Inflater),
    Unreadable(InflateError),
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
        let coding = encoding(header("content-encoding").as_deref());
        let mut readers = false;
        for m in &mut self.limits {
            match &m.source {
                UsageSource::Header(h) => {
                    m.read = Some(match header(&h.name).map(|v| usage_from_header(&v)) {
                        // The operator's bounds hold whatever the upstream says.
                        Some(UsageRead::Found(n)) => UsageRead::Found(n.clamp(h.min, h.max)),
                        Some(UsageRead::Invalid(crate::usage::Unreadable::OutOfRange))
                            if h.max < MAX_USAGE =>
                        {
                            UsageRead::Found(h.max)
                        }
                        Some(read) => read,
                        None => UsageRead::Missing,
                    });
                }
                UsageSource::Status(codes) => {
                    let status = header(":status")
                        .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<u16>().ok());
                    m.read = Some(match status {
                        Some(status) => UsageRead::Found(u64::from(codes.contains(&status))),
                        None => UsageRead::Missing,
                    });
                }
                UsageSource::Body(usage) => match kind {
                    Some(kind) => {
                        m.reader = Some(UsageReader::of(kind, usage, MAX_USAGE_BODY));
                        readers = true;
                    }
                    None => m.read = Some(UsageRead::Missing),
                },
            }
        }
        // The inflater's window is only allocated for a body that is read.
        if readers {
            self.body = match Inflater::new(coding, MAX_USAGE_BODY) {
                Some(inflater) => BodyCoding::Inflate(inflater),
                None if coding == Encoding::Unsupported => {
                    BodyCoding::Unreadable(InflateError::Unsupported)
                }
                None => BodyCoding::Plain,
            };
        }
    }

    /// Whether body chunks are still wanted.
    pub fn wants_body(&self) -> bool {
        let coding = match &self.body {
            BodyCoding::Plain => true,
            BodyCoding::Inflate(inflater) => inflater.failed().is_none(),
            BodyCoding::Unreadable(_) => false,
        };
        coding
            && self
                .limits
                .iter()
                .any(|m| m.reader.as_ref().is_some_and(|r| !r.done()))
    }

    /// The body's kind, if a body is read (for logs and tests).
    pub fn body_kind(content_type: &[u8]) -> Option<BodyKind> {
        body_kind(content_type)
    }

    /// A chunk of the response body, as it passes.
    pub fn feed(&mut self, chunk: &[u8]) {
        let limits = &mut self.limits;
        let mut read = |bytes: &[u8]| {
            for m in limits.iter_mut() {
                if let Some(reader) = m.reader.as_mut().filter(|r| !r.done()) {
                    reader.feed(bytes);
                }
            }
        };
        match &mut self.body {
            BodyCoding::Plain => read(chunk),
            BodyCoding::Inflate(inflater) => inflater.feed(chunk, &mut read),
            BodyCoding::Unreadable(_) => {}
        }
    }

    /// What the body's decoding holds (an inflater's window and state), for the tests of its
    /// bound.
    pub fn decoder_bytes(&self) -> usize {
        match &self.body {
            BodyCoding::Inflate(inflater) => inflater.memory_bytes(),
            BodyCoding::Plain | BodyCoding::Unreadable(_) => 0,
        }
    }

    /// The stream ended (`complete`: the body's end was seen; false: it ended early, its
    /// usage is what was read so far). Each limit's outcome.
    pub fn finish(self, complete: bool) -> Vec<UsageCharge> {
        // A compressed body counts as whole only if its compressed data ended whole; one that
        // cannot be decoded leaves every body reader's estimate standing.
        let (complete, failed) = match &self.body {
            BodyCoding::Plain => (complete, None),
            BodyCoding::Inflate(inflater) => (complete && inflater.ended(), inflater.failed()),
            BodyCoding::Unreadable(why) => (complete, Some(*why)),
        };
        self.limits
            .into_iter()
            .map(|mut m| {
                let read = match (m.read, m.reader.as_mut(), failed) {
                    (Some(read), _, _) => Ok(read),
                    (None, Some(_), Some(why)) => Err(why),
                    (None, Some(reader), None) => Ok(reader.finish(complete)),
                    // No response headers came (the stream ended before them).
                    (None, None, _) => Ok(UsageRead::Missing),
                };
                let (charged, unread) = match read {
                    Ok(UsageRead::Found(n)) if n <= MAX_USAGE => (n, None),
                    Ok(UsageRead::Found(_)) => (m.check.cost, Some("too_large")),
                    Ok(UsageRead::Missing) => (m.check.cost, Some("missing")),
                    Ok(UsageRead::Invalid(why)) => (m.check.cost, Some(why.name())),
                    Err(why) => (m.check.cost, Some(why.name())),
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
    use crate::config::HeaderUsage;
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
    fn a_status_source_charges_one_for_a_listed_status_and_gives_the_rest_back() {
        let cases = [
            (Some("401"), 1, None, None),
            (Some("403"), 1, None, None),
            (Some("200"), 0, None, Some(-1)),
            (Some("500"), 0, None, Some(-1)),
            // No status to read (the stream ended before the response): the reservation stands.
            (None, 1, Some("missing"), None),
            (Some("abc"), 1, Some("missing"), None),
        ];
        for (status, charged, unread, delta) in cases {
            let mut m = UsageMeter::default();
            let check = LimitCheck {
                cost: 1,
                ..token_bucket_check("k")
            };
            m.add(check, 1, UsageSource::Status(vec![401, 403]));
            let list: Vec<(&str, &str)> = status.map(|s| (":status", s)).into_iter().collect();
            m.on_headers(&headers(&list));
            assert!(!m.wants_body(), "{status:?}: the status is all it reads");
            let out = m.finish(true);
            assert_eq!(
                (out[0].charged, out[0].unread),
                (charged, unread),
                "{status:?}"
            );
            assert_eq!(out[0].settlement().map(|s| s.delta), delta, "{status:?}");
        }
    }

    #[test]
    fn a_usage_above_the_estimate_is_debt() {
        let mut m = meter(100, UsageSource::Header(HeaderUsage::unbounded("x-usage")));
        m.on_headers(&headers(&[("x-usage", "250")]));
        assert!(!m.wants_body());
        let out = m.finish(true);
        assert_eq!(out[0].settlement().map(|s| s.delta), Some(150));
        assert_eq!(out[0].debt(), 150);
    }

    #[test]
    fn a_header_usage_is_charged_within_the_operators_bounds() {
        let bounded = HeaderUsage {
            name: "x-cost".into(),
            min: 1,
            max: 20,
        };
        for (value, delta, unread) in [
            (Some("7"), Some(-93), None),
            (Some("0"), Some(-99), None),
            (Some("500"), Some(-80), None),
            (Some("20"), Some(-80), None),
            (Some("10000000000000"), Some(-80), None),
            (Some("-5"), None, Some("negative")),
            (Some("lots"), None, Some("not_a_number")),
            (None, None, Some("missing")),
        ] {
            // 100 reserved, the estimate.
            let mut m = meter(100, UsageSource::Header(bounded.clone()));
            let sent: Vec<(&str, &str)> = value.map(|v| ("x-cost", v)).into_iter().collect();
            m.on_headers(&headers(&sent));
            let out = m.finish(true);
            assert_eq!(out[0].settlement().map(|s| s.delta), delta, "{value:?}");
            assert_eq!(
                out[0].unread, unread,
                "{value:?}: a bad value keeps the reservation"
            );
        }
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

    fn gzip(body: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(body).unwrap();
        e.finish().unwrap()
    }

    /// A meter for one body limit and one header limit, fed `chunks` of a response with
    /// these headers: each limit's charge and why it was unread.
    fn read_encoded(
        list: &[(&str, &str)],
        chunks: &[&[u8]],
        complete: bool,
    ) -> Vec<(u64, Option<&'static str>)> {
        let mut m = meter(100, body());
        m.add(
            token_bucket_check("h"),
            100,
            UsageSource::Header(HeaderUsage::unbounded("x-usage")),
        );
        m.on_headers(&headers(list));
        for chunk in chunks {
            if m.wants_body() {
                m.feed(chunk);
            }
        }
        m.finish(complete)
            .into_iter()
            .map(|c| (c.charged, c.unread))
            .collect()
    }

    #[test]
    fn a_compressed_body_is_read_inflated() {
        let json = br#"{"choices":[],"usage":{"total_tokens":30}}"#;
        let events = b"data: {\"usage\":null}\n\ndata: {\"usage\":{\"total_tokens\":40}}\n\ndata: [DONE]\n\n";
        for (kind, body, want) in [
            ("application/json", &json[..], 30),
            ("text/event-stream", &events[..], 40),
        ] {
            let packed = gzip(body);
            let list = [
                ("content-type", kind),
                ("content-encoding", "gzip"),
                ("x-usage", "7"),
            ];
            for at in 0..=packed.len() {
                let out = read_encoded(&list, &[&packed[..at], &packed[at..]], true);
                assert_eq!(out, [(want, None), (7, None)], "{kind} split at {at}");
            }
            // Read as plain bytes, the compressed body is not JSON.
            let plain = [("content-type", kind)];
            assert_ne!(read_encoded(&plain, &[&packed], true)[0], (want, None));
        }
        // The inflater is only made for a body that is read, and freed with the meter.
        let mut m = meter(100, body());
        m.on_headers(&headers(&[
            ("content-type", "application/json"),
            ("content-encoding", "deflate"),
        ]));
        assert!(m.decoder_bytes() > 0 && m.decoder_bytes() <= crate::usage::INFLATER_BYTES);
        let mut m = meter(100, body());
        m.on_headers(&headers(&[
            ("content-type", "text/html"),
            ("content-encoding", "gzip"),
        ]));
        assert_eq!(m.decoder_bytes(), 0);
    }

    #[test]
    fn a_compressed_body_that_cannot_be_read_keeps_the_estimate() {
        let json = br#"{"usage":{"total_tokens":30}}"#;
        let packed = gzip(json);
        let json_type = ("content-type", "application/json");
        // Another encoding: not read at all; a header usage still is.
        for coding in ["br", "zstd", "gzip, br"] {
            let list = [json_type, ("content-encoding", coding), ("x-usage", "7")];
            let mut m = meter(100, body());
            m.on_headers(&headers(&list));
            assert!(!m.wants_body(), "{coding}");
            let out = read_encoded(&list, &[&packed], true);
            assert_eq!(
                out,
                [(100, Some("unsupported_encoding")), (7, None)],
                "{coding}"
            );
        }
        let gz = [json_type, ("content-encoding", "gzip"), ("x-usage", "7")];
        let mut corrupt = packed.clone();
        let at = corrupt.len() - 6;
        corrupt[at] ^= 0xff;
        let out = read_encoded(&gz, &[&corrupt], true);
        assert_eq!(out[0], (100, Some("corrupt_encoding")));
        // A bomb: past the read bound of inflated bytes the rest is not inflated.
        let bomb = gzip(&vec![b' '; (MAX_USAGE_BODY + (1 << 20)) as usize]);
        let mut m = meter(100, body());
        m.on_headers(&headers(&gz));
        for chunk in bomb.chunks(16 << 10) {
            m.feed(chunk);
        }
        assert!(!m.wants_body());
        assert_eq!(m.finish(true)[0].unread, Some("inflated_too_large"));
    }

    #[test]
    fn a_compressed_stream_cut_settles_what_it_read() {
        let events = b"data: {\"usage\":{\"total_tokens\":40}}\n\ndata: {\"choices\":[]}\n\n";
        let packed = gzip(events);
        let list = [
            ("content-type", "text/event-stream"),
            ("content-encoding", "gzip"),
        ];
        // The body ended before the gzip trailer: a cut stream, whose events before count.
        let cut = &packed[..packed.len() - 4];
        assert_eq!(read_encoded(&list, &[cut], true)[0], (40, None));
        // A JSON body whose trailer is missing counts if the whole document was inflated.
        let json = gzip(br#"{"usage":{"total_tokens":30}}"#);
        let list = [
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ];
        assert_eq!(
            read_encoded(&list, &[&json[..json.len() - 8]], true)[0],
            (30, None)
        );
        assert_eq!(
            read_encoded(&list, &[&json[..json.len() / 2]], true)[0].0,
            100
        );
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
