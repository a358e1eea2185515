//! Test-only generators of JSON text for the decoders' differential tests: objects built from
//! the usual fields, each absent now and then, of the right type, or odd (null, of the wrong
//! type, empty, escaped). Shared by the complete bodies (`response`) and the stream's chunks
//! (`stream`).

use proptest::prelude::*;

/// Odd values put where a field's usual value would be.
const ODD: [&str; 12] = [
    "null",
    "0",
    "1",
    "-1",
    "0.0",
    "\"\"",
    "\"x\\n\\u00e9\"",
    "{}",
    "[]",
    "{\"a\":1}",
    "[{\"type\":\"text\",\"text\":\"hi\"}]",
    "[\"hi\",[]]",
];

/// Values of unknown fields, of any shape.
const UNKNOWN: [&str; 5] = [
    "null",
    "\"chatcmpl-\\u00e9\"",
    "1e3",
    "{\"a\":[1,{\"b\":null}],\"c\":\"\\ud83d\\ude00\"}",
    "[true,false,-0.5]",
];

/// Builds JSON text strategies; `present` is how likely each field of an object is written.
pub(super) struct JsonText {
    present: f64,
}

impl JsonText {
    pub(super) fn new(present: f64) -> JsonText {
        JsonText { present }
    }

    fn odd() -> BoxedStrategy<String> {
        proptest::sample::select(ODD.to_vec())
            .prop_map(str::to_string)
            .boxed()
    }

    /// Mostly `good`, now and then an odd value.
    pub(super) fn either(&self, good: BoxedStrategy<String>) -> BoxedStrategy<String> {
        prop_oneof![12 => good, 1 => Self::odd()].boxed()
    }

    /// One of the JSON texts `good`, now and then an odd value.
    pub(super) fn pick(&self, good: &[&'static str]) -> BoxedStrategy<String> {
        let good = proptest::sample::select(good.to_vec())
            .prop_map(str::to_string)
            .boxed();
        self.either(good)
    }

    /// An object of `fields`, each present with the builder's likelihood.
    pub(super) fn object(
        &self,
        fields: Vec<(&'static str, BoxedStrategy<String>)>,
    ) -> BoxedStrategy<String> {
        let fields: Vec<_> = fields
            .into_iter()
            .map(|(k, v)| {
                proptest::option::weighted(
                    self.present,
                    v.prop_map(move |v| format!("\"{k}\":{v}")),
                )
            })
            .collect();
        fields
            .prop_map(|f| {
                format!(
                    "{{{}}}",
                    f.into_iter().flatten().collect::<Vec<_>>().join(",")
                )
            })
            .boxed()
    }

    /// An object of `fields` as a lenient server might write it: in any order, a field now and
    /// then twice (the second time with another value), a field's name now and then spelled
    /// with an escape, unknown fields of any shape among them ([`UNKNOWN`]). (An unknown field
    /// that only reading it as JSON refuses is skipped by the typed path and refused by the value
    /// path; `in_place`'s and the decoders' own tests pin that.)
    pub(super) fn loose_object(
        &self,
        fields: Vec<(&'static str, BoxedStrategy<String>)>,
    ) -> BoxedStrategy<String> {
        let present = self.present;
        let known: Vec<_> = fields
            .into_iter()
            .map(|(k, v)| {
                (
                    proptest::bool::weighted(present),
                    proptest::bool::weighted(0.01),
                    proptest::bool::weighted(0.1),
                    v.clone(),
                    v,
                )
                    .prop_map(move |(on, twice, escaped, a, b)| {
                        let mut out = Vec::new();
                        if on {
                            let key = if escaped {
                                // `\u0069d` for `id`.
                                let mut chars = k.chars();
                                let first = chars.next().map_or(0, u32::from);
                                format!("\\u{first:04x}{}", chars.as_str())
                            } else {
                                k.to_string()
                            };
                            out.push(format!("\"{key}\":{a}"));
                            if twice {
                                out.push(format!("\"{k}\":{b}"));
                            }
                        }
                        out
                    })
            })
            .collect();
        let unknown_value = proptest::sample::select(UNKNOWN.to_vec()).prop_map(str::to_string);
        let unknown = proptest::collection::vec(
            (
                proptest::sample::select(vec!["object", "x_extra", "logprobs"]),
                unknown_value,
            )
                .prop_map(|(k, v)| format!("\"{k}\":{v}")),
            0..2,
        );
        (known, unknown)
            .prop_map(|(known, unknown)| {
                known
                    .into_iter()
                    .flatten()
                    .chain(unknown)
                    .collect::<Vec<_>>()
            })
            .prop_shuffle()
            .prop_map(|members| format!("{{{}}}", members.join(",")))
            .boxed()
    }

    /// An array of up to two `item`s.
    pub(super) fn array(&self, item: BoxedStrategy<String>) -> BoxedStrategy<String> {
        proptest::collection::vec(item, 0..3)
            .prop_map(|items| format!("[{}]", items.join(",")))
            .boxed()
    }
}
