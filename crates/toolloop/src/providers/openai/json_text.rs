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

    /// An array of up to two `item`s.
    pub(super) fn array(&self, item: BoxedStrategy<String>) -> BoxedStrategy<String> {
        proptest::collection::vec(item, 0..3)
            .prop_map(|items| format!("[{}]", items.join(",")))
            .boxed()
    }
}
