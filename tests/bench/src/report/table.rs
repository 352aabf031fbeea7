//! The one place a markdown table is written: headers with their alignment, then rows.

/// A markdown table under construction.
#[derive(Clone, Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    /// Per column: numbers are right-aligned (`---:`), text left (`---`).
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new() -> Table {
        Table::default()
    }

    /// A left-aligned column (text).
    pub fn left(mut self, header: &str) -> Table {
        self.headers.push(header.to_string());
        self.right.push(false);
        self
    }

    /// A right-aligned column (numbers).
    pub fn right(mut self, header: &str) -> Table {
        self.headers.push(header.to_string());
        self.right.push(true);
        self
    }

    /// One row, a cell per column. A row of another width is a bug in the bench: it would
    /// shift every cell after it under the wrong header.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        assert_eq!(
            cells.len(),
            self.headers.len(),
            "a row of {} cells under {} headers ({:?}): {cells:?}",
            cells.len(),
            self.headers.len(),
            self.headers
        );
        self.rows.push(cells);
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn render(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let rule: Vec<String> = self
            .right
            .iter()
            .map(|&r| if r { "---:" } else { "---" }.to_string())
            .collect();
        let mut out = line(&self.headers);
        out.push_str(&format!("|{}|\n", rule.join("|")));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_rule_and_rows_are_written_in_markdown() {
        let mut t = Table::new().left("scenario").right("req/s");
        t.row(["`a`", "1,000"]);
        t.row(vec!["`b`".to_string(), "20".to_string()]);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.render(),
            "| scenario | req/s |\n|---|---:|\n| `a` | 1,000 |\n| `b` | 20 |\n"
        );
    }

    #[test]
    #[should_panic(expected = "a row of 1 cells under 2 headers")]
    fn a_row_of_the_wrong_width_is_refused() {
        let mut t = Table::new().left("a").right("b");
        t.row(["only one"]);
    }
}
