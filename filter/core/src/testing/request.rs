//! A request for tests and examples: its headers in order (a name may repeat), its peer and
//! its route, read through the same header lookups the adapter uses on Envoy's header map.

use crate::config::{BodyPath, MetadataPath};
use crate::request::body::{BodyFields, BodyValues};
use crate::request::view::{first_header, header_count, BadRequest, RequestView};

#[derive(Debug, Default, Clone)]
pub struct FakeRequest {
    pub headers: Vec<(String, Vec<u8>)>,
    /// The downstream peer, `ip:port`.
    pub source: Option<String>,
    pub route: Option<String>,
    /// Dynamic metadata, each value at its `NAMESPACE:KEY…` as a `metadata:` source names it.
    pub metadata: Vec<(String, Vec<u8>)>,
    /// The `body:` values, once a body was read ([`Self::with_body`]).
    pub body: Option<BodyValues>,
}

impl FakeRequest {
    /// `method` on `path`, from 10.1.2.3:4567.
    pub fn new(method: &str, path: &str) -> Self {
        FakeRequest {
            source: Some("10.1.2.3:4567".into()),
            ..Default::default()
        }
        .with(":method", method.as_bytes())
        .with(":path", path.as_bytes())
    }

    /// Sets the header: replaces every copy of it.
    pub fn with(mut self, name: &str, value: &[u8]) -> Self {
        self.headers.retain(|(n, _)| n != name);
        self.also(name, value)
    }

    /// Sets the metadata value at `path` (`NAMESPACE:KEY…`).
    pub fn with_metadata(mut self, path: &str, value: &[u8]) -> Self {
        self.metadata.retain(|(p, _)| p != path);
        self.metadata.push((path.into(), value.to_vec()));
        self
    }

    /// The request's body has ended: `json`, scanned for `paths` (a config's `body_fields`)
    /// in chunks of 7 bytes, as the adapter does.
    pub fn with_body(mut self, paths: &[BodyPath], json: &[u8]) -> Self {
        let mut fields = BodyFields::new(paths);
        for chunk in json.chunks(7) {
            fields.feed(chunk);
        }
        self.body = Some(fields.values(json.len() as u64, &mut |at, len| {
            let at = usize::try_from(at).unwrap_or(json.len()).min(json.len());
            json[at..(at + len).min(json.len())].to_vec()
        }));
        self
    }

    /// Adds one more copy of the header.
    pub fn also(mut self, name: &str, value: &[u8]) -> Self {
        self.headers.push((name.into(), value.to_vec()));
        self
    }
}

impl RequestView for FakeRequest {
    fn header(&self, name: &str) -> Option<&[u8]> {
        first_header(&self.headers, name)
    }
    fn header_copies(&self, name: &str) -> usize {
        header_count(&self.headers, name)
    }
    fn source_address(&self) -> Option<String> {
        self.source.clone()
    }
    fn route_name(&self) -> Option<String> {
        self.route.clone()
    }
    fn metadata(&self, path: &MetadataPath) -> Option<Vec<u8>> {
        let wanted = format!("{}:{}", path.namespace, path.keys.join(":"));
        self.metadata
            .iter()
            .find(|(p, _)| *p == wanted)
            .map(|(_, v)| v.clone())
    }
    fn body_field(&self, path: &BodyPath) -> Result<Option<&[u8]>, BadRequest> {
        self.body.as_ref().map_or(Ok(None), |b| b.get(path))
    }
}
