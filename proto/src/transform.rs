//! Transforms a view applies at conversion, so that warm epochs run none
//! of them: a tensor's `transform` is a list of steps, applied in order
//! to each value (as an f64) after it is read and before it is stored as
//! the tensor's dtype.
//!
//! ```text
//! log1p                     ln(1 + x)
//! clip(lo, hi)              x below lo is lo, above hi is hi
//! standardize(mean, std)    (x - mean) / std
//! bucketize(b0, b1, ...)    the number of boundaries at or below x: x < b0 is 0,
//!                           b0 <= x < b1 is 1, ..., x >= the last is n (NaN is 0);
//!                           last in the list, its tensor's dtype an integer
//! ```
//!
//! A null takes the tensor's `fill` as it is, not transformed. The steps
//! enter the dataset version in their canonical spelling
//! ([`Step`]'s `Display`), so `clip(0,10)` and `clip(0, 10)` are one
//! version.

use crate::DType;
use std::fmt;
use std::str::FromStr;

/// One step of a transform.
#[derive(Clone, PartialEq, Debug)]
pub enum Step {
    /// `ln(1 + x)`.
    Log1p,
    /// `x` bounded to `[lo, hi]`.
    Clip {
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// `(x - mean) / std`.
    Standardize {
        /// Subtracted.
        mean: f64,
        /// Divided by (positive).
        std: f64,
    },
    /// The number of boundaries at or below `x`.
    Bucketize(Vec<f64>),
}

impl Step {
    /// `x` after this step.
    pub fn apply(&self, x: f64) -> f64 {
        match self {
            Step::Log1p => x.ln_1p(),
            Step::Clip { lo, hi } => x.clamp(*lo, *hi),
            Step::Standardize { mean, std } => (x - mean) / std,
            Step::Bucketize(b) => b.partition_point(|&v| v <= x) as f64,
        }
    }
}

/// `x` after every step of `steps`, in order.
pub fn apply(steps: &[Step], x: f64) -> f64 {
    steps.iter().fold(x, |v, s| s.apply(v))
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Log1p => write!(f, "log1p"),
            Step::Clip { lo, hi } => write!(f, "clip({lo:?}, {hi:?})"),
            Step::Standardize { mean, std } => write!(f, "standardize({mean:?}, {std:?})"),
            Step::Bucketize(b) => {
                let b: Vec<String> = b.iter().map(|v| format!("{v:?}")).collect();
                write!(f, "bucketize({})", b.join(", "))
            }
        }
    }
}

impl FromStr for Step {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let (name, args) = match t.split_once('(') {
            None => (t, None),
            Some((n, rest)) => {
                let inner = rest.strip_suffix(')').ok_or_else(|| format!("{text:?}: a ')' must close it"))?;
                let args: Result<Vec<f64>, String> = inner
                    .split(',')
                    .map(|a| a.trim().parse::<f64>().map_err(|_| format!("{text:?}: {:?} is not a number", a.trim())))
                    .collect();
                (n.trim(), Some(args?))
            }
        };
        let args = args.unwrap_or_default();
        let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
        match (name, args.as_slice()) {
            ("log1p", []) => Ok(Step::Log1p),
            ("clip", [lo, hi]) if finite(&[*lo, *hi]) && lo <= hi => Ok(Step::Clip { lo: *lo, hi: *hi }),
            ("clip", _) => Err(format!("{text:?}: clip takes two finite bounds, lo <= hi: clip(0, 10)")),
            ("standardize", [mean, std]) if finite(&[*mean, *std]) && *std > 0.0 => {
                Ok(Step::Standardize { mean: *mean, std: *std })
            }
            ("standardize", _) => {
                Err(format!("{text:?}: standardize takes a finite mean and a positive std: standardize(3.5, 1.2)"))
            }
            ("bucketize", b) if !b.is_empty() && finite(b) && b.windows(2).all(|w| w[0] < w[1]) => {
                Ok(Step::Bucketize(b.to_vec()))
            }
            ("bucketize", _) => {
                Err(format!("{text:?}: bucketize takes finite boundaries in increasing order: bucketize(0, 10, 100)"))
            }
            _ => Err(format!(
                "{text:?}: not a transform (log1p, clip(lo, hi), standardize(mean, std), bucketize(b0, ...))"
            )),
        }
    }
}

/// The steps of `texts`, checked against the tensor's `dtype`: a bucketize
/// comes last and makes integers (the dtype must be an integer type that
/// holds every bucket index); every other step makes floats (the dtype
/// must be a float).
pub fn parse(texts: &[String], dtype: DType) -> Result<Vec<Step>, String> {
    let steps: Vec<Step> = texts.iter().map(|t| t.parse()).collect::<Result<_, _>>()?;
    let buckets = steps.iter().position(|s| matches!(s, Step::Bucketize(_)));
    let float = matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    match buckets {
        Some(i) if i + 1 != steps.len() => Err("bucketize must be the last step: it makes bucket indices".into()),
        Some(i) => {
            let Step::Bucketize(b) = &steps[i] else { unreachable!("found as a bucketize") };
            let most = match dtype {
                DType::I64 => i64::MAX as f64,
                DType::I32 => f64::from(i32::MAX),
                DType::I16 => f64::from(i16::MAX),
                DType::I8 => f64::from(i8::MAX),
                DType::U8 => f64::from(u8::MAX),
                other => {
                    return Err(format!("bucketize makes bucket indices: the dtype must be an integer, not {other}"));
                }
            };
            if b.len() as f64 > most {
                return Err(format!("bucketize has {} boundaries, more than dtype {dtype} can count", b.len()));
            }
            Ok(steps)
        }
        None if !steps.is_empty() && !float => {
            Err(format!("{} makes floats: the dtype must be a float, not {dtype}", texts.join(", ")))
        }
        None => Ok(steps),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(t: &[&str], dtype: DType) -> Result<Vec<Step>, String> {
        parse(&t.iter().map(|s| s.to_string()).collect::<Vec<_>>(), dtype)
    }

    #[test]
    fn steps_apply_in_order() {
        let s = steps(&["log1p", "clip(0, 2)", "standardize(1, 0.5)"], DType::F32).unwrap();
        assert_eq!(apply(&s, 0.0), -2.0);
        assert_eq!(apply(&s, 1e9), 2.0, "clipped at 2, then (2 - 1) / 0.5");
        assert!((apply(&s, std::f64::consts::E - 1.0) - 0.0).abs() < 1e-12);
        let b = steps(&["bucketize(0, 10, 100)"], DType::I64).unwrap();
        let got: Vec<f64> = [-1.0, 0.0, 5.0, 10.0, 99.9, 100.0, 1e9, f64::NAN].iter().map(|&x| apply(&b, x)).collect();
        assert_eq!(got, [0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 0.0]);
        let both = steps(&["log1p", "bucketize(1, 2)"], DType::I32).unwrap();
        assert_eq!((apply(&both, 5.0), apply(&both, 10.0)), (1.0, 2.0), "ln 6 = 1.79, ln 11 = 2.40");
    }

    #[test]
    fn the_canonical_spelling_round_trips() {
        for t in ["log1p", "clip(0.0, 10.0)", "standardize(3.5, 1.2)", "bucketize(0.0, 10.0, 100.0)"] {
            assert_eq!(t.parse::<Step>().unwrap().to_string(), t);
        }
        assert_eq!("clip(0,10)".parse::<Step>().unwrap().to_string(), "clip(0.0, 10.0)");
    }

    #[test]
    fn bad_steps_say_what_they_take() {
        let e = |t: &[&str], d| steps(t, d).unwrap_err();
        assert!(e(&["log2"], DType::F32).contains("not a transform"));
        assert!(e(&["clip(5, 1)"], DType::F32).contains("lo <= hi"));
        assert!(e(&["clip(0, x)"], DType::F32).contains("not a number"));
        assert!(e(&["standardize(1, 0)"], DType::F32).contains("positive std"));
        assert!(e(&["bucketize(3, 1)"], DType::I64).contains("increasing"));
        assert!(e(&["bucketize(1)", "log1p"], DType::I64).contains("last step"));
        assert!(e(&["bucketize(1)"], DType::F32).contains("must be an integer"));
        assert!(e(&["log1p"], DType::I64).contains("must be a float"));
        assert!(e(&["clip(0, 1"], DType::F32).contains("')'"));
        let many: Vec<String> = (0..300).map(|i| i.to_string()).collect();
        assert!(e(&[&format!("bucketize({})", many.join(", "))], DType::I8).contains("more than"));
    }
}
