//! Numbers as the report writes them.

pub fn thousands(n: f64) -> String {
    let n = n.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Milliseconds: 2 decimals below 100.
pub fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Seconds with 3 significant digits (the CPU columns span three orders of magnitude).
pub fn sig3(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    format!("{v:.digits$}")
}

/// A value with 2 decimals, or "–" when there is none.
pub fn opt2(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.2}"))
}

/// Numbers joined with " / ".
pub fn joined<T: ToString>(values: &[T]) -> String {
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(thousands(50931.4), "50,931");
        assert_eq!(thousands(204.0), "204");
        assert_eq!(thousands(1234567.0), "1,234,567");
        assert_eq!(sig3(0.0196), "0.0196");
        assert_eq!(sig3(0.123), "0.123");
        assert_eq!(sig3(1.5), "1.50");
        assert_eq!(opt2(None), "–");
        assert_eq!(joined(&[1, 2]), "1 / 2");
    }
}
