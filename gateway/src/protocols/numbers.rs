//! Integer parameters as the wire carries them (JSON numbers; SDKs may send `2.0` for `2`),
//! turned once, at the edge, into the generation request's typed fields. Each error names the
//! parameter as the caller wrote it; checks that need the model (`n` against the engine's most
//! choices, `dimensions` against the model's width) stay with the model, in the facade.

use serde_json::Number;

use crate::error::ApiError;

/// An integer parameter from `min` to `max`: a JSON integer, or a float with no fraction.
pub(crate) fn integer(param: &str, n: &Number, min: i64, max: i64) -> Result<i64, ApiError> {
    let value = n
        .as_i64()
        .or_else(|| n.as_u64().map(|u| i64::try_from(u).unwrap_or(i64::MAX)))
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        })
        .ok_or_else(|| {
            ApiError::invalid(param, format!("'{param}' must be an integer, got {n}"))
        })?;
    if value < min || value > max {
        return Err(ApiError::out_of_range(param, value, min, max));
    }
    Ok(value)
}

/// An optional count from `min` to `max` (both within `u32`).
pub(crate) fn count(
    param: &str,
    n: Option<&Number>,
    min: u32,
    max: u32,
) -> Result<Option<u32>, ApiError> {
    n.map(|n| integer(param, n, i64::from(min), i64::from(max)).map(|v| v as u32))
        .transpose()
}

/// An optional `seed`: any 64-bit integer, negative ones taken as their two's complement.
pub(crate) fn seed(n: Option<&Number>) -> Result<Option<u64>, ApiError> {
    n.map(|n| integer("seed", n, i64::MIN, i64::MAX).map(|v| v as u64))
        .transpose()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn number(v: Value) -> Number {
        match v {
            Value::Number(n) => n,
            _ => Number::from(0),
        }
    }

    #[test]
    fn integers_accept_whole_floats_and_name_the_parameter() {
        assert_eq!(integer("n", &number(json!(2)), 1, 5), Ok(2));
        assert_eq!(integer("n", &number(json!(2.0)), 1, 5), Ok(2));
        let err = integer("n", &number(json!(2.5)), 1, 5).expect_err("fraction");
        assert!(
            matches!(&err, ApiError::InvalidParam { param, .. } if param == "n"),
            "{err:?}"
        );
        assert!(integer("n", &number(json!(9)), 1, 5).is_err());
    }

    #[test]
    fn counts_and_seeds_are_typed() {
        assert_eq!(count("n", None, 1, 5), Ok(None));
        assert_eq!(count("n", Some(&number(json!(3))), 1, 5), Ok(Some(3)));
        assert!(count("n", Some(&number(json!(-1))), 0, 5).is_err());
        assert_eq!(seed(Some(&number(json!(-1)))), Ok(Some(u64::MAX)));
        assert_eq!(
            seed(Some(&number(json!(u64::MAX)))),
            Ok(Some(i64::MAX as u64))
        );
    }
}
