//! The Structured Field Lists the rate-limit headers use (RFC 8941 / RFC 9651), read with the
//! `sfv` crate: a parser written by other hands than the filter's header serializer, complete
//! (decimals, booleans, byte sequences, inner lists), so a test that reads a header proves it
//! is well-formed.

/// One List member that is an Item (the filter's headers hold no inner lists).
#[derive(Debug, Clone, PartialEq)]
pub struct Item(sfv::Item);

impl Item {
    /// The item's String value.
    pub fn name(&self) -> Option<&str> {
        self.0.bare_item.as_string().map(|s| s.as_str())
    }

    /// An Integer parameter.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.0
            .params
            .iter()
            .find(|(k, _)| k.as_str() == key)
            .and_then(|(_, v)| v.as_integer())
            .map(i64::from)
    }
}

/// Parses a List; `Err` says why it is malformed (or holds an inner list).
pub fn parse_list(input: &str) -> Result<Vec<Item>, String> {
    let list: sfv::List = sfv::Parser::new(input)
        .parse_list()
        .map_err(|e| e.to_string())?;
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => Ok(Item(item)),
            sfv::ListEntry::InnerList(_) => Err("an inner list where an item was expected".into()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_of_items_with_parameters() {
        let items = parse_list(r#""api.second";q=20;w=1, "api.day";r=9999;t=52000"#).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].name(), Some("api.second"));
        assert_eq!((items[0].int("q"), items[0].int("w")), (Some(20), Some(1)));
        assert_eq!(items[1].int("t"), Some(52000));
        assert_eq!(items[1].int("q"), None);
    }

    #[test]
    fn malformed_lists_are_errors() {
        for bad in [
            r#""unterminated"#,
            "a;=1",
            "\"x\";q=1.5.5",
            "\"x\",",
            "(\"a\")",
        ] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
        // Complete: decimals and booleans are values, not errors.
        let items = parse_list("\"x\";d=1.5;b=?0").unwrap();
        assert_eq!(items[0].int("d"), None);
    }
}
