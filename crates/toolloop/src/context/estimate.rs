//! Estimating how many input tokens the next request will hold, without a tokenizer and without
//! recounting the conversation.
//!
//! The estimate starts from what the provider said last: the input tokens it reported for the
//! last call. What has been added since is estimated from its size in bytes, at a ratio of
//! bytes per token calibrated from the reported figures (4 until the first report). Images
//! count a fixed [`IMAGE_TOKENS`] each. Every step is incremental: adding or removing a message
//! costs its own size, and the estimate itself is O(1).
//!
//! ```
//! use toolloop::context::TokenEstimator;
//! use toolloop::Message;
//!
//! let mut estimator = TokenEstimator::new();
//! estimator.add(&Message::system("You are terse."));
//! estimator.add(&Message::user("Summarise the report."));
//! let before = estimator.estimate();
//! // The provider reports 30 input tokens for that request: the estimate is now exact, and the
//! // ratio of bytes per token is calibrated from it.
//! estimator.observe(30);
//! assert_eq!(estimator.estimate(), 30);
//! estimator.add(&Message::user("And the appendix."));
//! assert!(estimator.estimate() > 30);
//! # let _ = before;
//! ```

use crate::message::Message;
use crate::model::ToolSpec;
use std::io::Write;

/// Bytes per token before any report: a usual figure for English text and JSON with the
/// tokenizers of the major providers.
pub const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;

/// The lowest and highest ratio a calibration may set; reports outside them are taken as
/// reports about something else (a tiny request, a cached one that reported nothing) and
/// clamped.
pub const BYTES_PER_TOKEN_RANGE: (f64, f64) = (1.0, 16.0);

/// The tokens an image counts for. Providers count an image by its size (OpenAI: 85 plus 170
/// per 512-pixel tile; Anthropic: width × height / 750, about 1,600 at most for an image it does
/// not scale down); this is a round figure near the top of those ranges.
pub const IMAGE_TOKENS: u64 = 1_600;

/// A report on fewer bytes than this does not calibrate the ratio (the provider's fixed
/// overhead per request would dominate it).
const MIN_CALIBRATION_BYTES: u64 = 256;

/// The size of what a request holds, as the estimator counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Size {
    /// Bytes of text: contents, tool-call names and arguments, provider parts, as JSON where
    /// they are JSON.
    pub bytes: u64,
    /// Images.
    pub images: u64,
}

impl Size {
    /// The size of one message.
    pub fn of_message(message: &Message) -> Size {
        let mut size = Size::default();
        match message {
            Message::System { content } => size.bytes += content.len() as u64,
            Message::User { content, images } => {
                size.bytes += content.len() as u64;
                size.images += images.len() as u64;
            }
            Message::Tool(r) => {
                size.bytes += (r.call_id.len() + r.name.len() + r.content.len()) as u64;
                size.images += r.images.len() as u64;
            }
            Message::Assistant(a) => {
                size.bytes += a.text.as_ref().map_or(0, |t| t.len() as u64);
                for call in &a.tool_calls {
                    size.bytes += (call.id.len() + call.name.len()) as u64;
                    size.bytes += match &call.invalid_arguments {
                        Some(raw) => raw.len() as u64,
                        None => json_len(&call.arguments),
                    };
                }
                for part in &a.parts {
                    size.bytes += json_len(&part.data);
                }
            }
        }
        size
    }

    /// The size of a tool catalog: each tool's name, description and schema.
    pub fn of_tools(tools: &[ToolSpec]) -> Size {
        Size {
            bytes: tools
                .iter()
                .map(|t| (t.name.len() + t.description.len()) as u64 + json_len(&t.parameters))
                .sum(),
            images: 0,
        }
    }

    /// The size of a piece of text (a system prompt kept outside the conversation, say).
    pub fn of_text(text: &str) -> Size {
        Size {
            bytes: text.len() as u64,
            images: 0,
        }
    }
}

/// The length of a JSON value's compact encoding (as `serde_json::to_string` writes it),
/// counted by walking the value: no encoding is made, except of a number that is not an
/// integer (its shortest form is what the encoder would find).
fn json_len(value: &serde_json::Value) -> u64 {
    use serde_json::Value;
    match value {
        Value::Null | Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => decimal_len(u),
            (None, Some(i)) => 1 + decimal_len(i.unsigned_abs()),
            (None, None) => encoded_len(n),
        },
        Value::String(s) => json_str_len(s),
        Value::Array(items) => {
            // Brackets, and a comma between items.
            let commas = items.len().saturating_sub(1) as u64;
            2 + commas + items.iter().map(json_len).sum::<u64>()
        }
        Value::Object(map) => {
            // Braces, a colon per member, and a comma between members.
            let commas = map.len().saturating_sub(1) as u64;
            2 + commas
                + map
                    .iter()
                    .map(|(k, v)| json_str_len(k) + 1 + json_len(v))
                    .sum::<u64>()
        }
    }
}

/// The digits of `n` in decimal.
pub(crate) fn decimal_len(mut n: u64) -> u64 {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// The length of `s` as a JSON string: its quotes, and the escapes `serde_json` writes (a
/// quote, a backslash and the controls below U+0020; `\b`, `\t`, `\n`, `\f` and `\r` in two
/// bytes, the others as `\u00XX`).
fn json_str_len(s: &str) -> u64 {
    let escapes: u64 = s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\x08' | b'\t' | b'\n' | b'\x0c' | b'\r' => 1,
            0..=0x1f => 5,
            _ => 0,
        })
        .sum();
    2 + s.len() as u64 + escapes
}

/// The length of a value's compact encoding, by encoding it to a counter.
fn encoded_len(value: &impl serde::Serialize) -> u64 {
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a number to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The provider's last report, and what the estimator had counted when it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Anchor {
    tokens: u64,
    size: Size,
}

/// Estimates the input tokens of the next request: the provider's last report plus an estimate
/// of what was added since (see the [module docs](self)).
///
/// The owner adds to it what it adds to the requests it sends (messages, the catalog, a system
/// prompt), removes what it takes out, and calls [`TokenEstimator::observe`] with the input
/// tokens the provider reported for a request that held exactly what had been added.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEstimator {
    bytes_per_token: f64,
    size: Size,
    anchor: Option<Anchor>,
    calibrated: bool,
}

impl Default for TokenEstimator {
    fn default() -> Self {
        TokenEstimator::new()
    }
}

impl TokenEstimator {
    /// An empty estimator at [`DEFAULT_BYTES_PER_TOKEN`].
    pub fn new() -> Self {
        TokenEstimator::with_bytes_per_token(DEFAULT_BYTES_PER_TOKEN)
    }

    /// An empty estimator starting at the given ratio (clamped to [`BYTES_PER_TOKEN_RANGE`];
    /// a ratio that is not a number gives the default). A report calibrates it anew.
    pub fn with_bytes_per_token(bytes_per_token: f64) -> Self {
        TokenEstimator {
            bytes_per_token: clamp_ratio(bytes_per_token),
            size: Size::default(),
            anchor: None,
            calibrated: false,
        }
    }

    /// Counts a message the next request will hold.
    pub fn add(&mut self, message: &Message) {
        self.add_size(Size::of_message(message));
    }

    /// Counts a tool catalog the next request will hold.
    pub fn add_tools(&mut self, tools: &[ToolSpec]) {
        self.add_size(Size::of_tools(tools));
    }

    /// Counts a size measured elsewhere ([`Size::of_text`] for a system prompt, say).
    pub fn add_size(&mut self, size: Size) {
        self.size.bytes = self.size.bytes.saturating_add(size.bytes);
        self.size.images = self.size.images.saturating_add(size.images);
    }

    /// Takes out a message counted before (a result cleared, a part dropped). The estimate goes
    /// down by the message's estimate, also below the last report.
    pub fn remove(&mut self, message: &Message) {
        self.remove_size(Size::of_message(message));
    }

    /// Takes out a size counted before.
    pub fn remove_size(&mut self, size: Size) {
        self.size.bytes = self.size.bytes.saturating_sub(size.bytes);
        self.size.images = self.size.images.saturating_sub(size.images);
    }

    /// Records the input tokens the provider reported (`Usage::input_tokens`, cached tokens
    /// included) for a request that held exactly what has been counted: the estimate becomes
    /// that figure, and, when the request held at least a few hundred bytes of text, the ratio
    /// of bytes per token is calibrated from it.
    pub fn observe(&mut self, reported_input_tokens: u64) {
        let image_tokens = self.size.images.saturating_mul(IMAGE_TOKENS);
        let text_tokens = reported_input_tokens.saturating_sub(image_tokens);
        if self.size.bytes >= MIN_CALIBRATION_BYTES && text_tokens > 0 {
            self.bytes_per_token = clamp_ratio(self.size.bytes as f64 / text_tokens as f64);
            self.calibrated = true;
        }
        self.anchor = Some(Anchor {
            tokens: reported_input_tokens,
            size: self.size,
        });
    }

    /// The provider reported the input tokens of a request it edited itself (see
    /// [`crate::context::native`]): the estimate becomes that figure, and the ratio of bytes
    /// per token is left as it is (the request held less than what has been counted).
    pub fn observe_edited(&mut self, reported_input_tokens: u64) {
        self.anchor = Some(Anchor {
            tokens: reported_input_tokens,
            size: self.size,
        });
    }

    /// The estimated input tokens of a request holding what has been counted.
    pub fn estimate(&self) -> u64 {
        match self.anchor {
            None => self.tokens_of(self.size),
            Some(anchor) => {
                let (now, then) = (self.size, anchor.size);
                let added = self.tokens_of(Size {
                    bytes: now.bytes.saturating_sub(then.bytes),
                    images: now.images.saturating_sub(then.images),
                });
                let removed = self.tokens_of(Size {
                    bytes: then.bytes.saturating_sub(now.bytes),
                    images: then.images.saturating_sub(now.images),
                });
                anchor.tokens.saturating_add(added).saturating_sub(removed)
            }
        }
    }

    /// The estimated tokens of a size at the current ratio (rounded up).
    pub fn tokens_of(&self, size: Size) -> u64 {
        let text = (size.bytes as f64 / self.bytes_per_token).ceil();
        // `as` saturates a float that is too large for u64.
        (text as u64).saturating_add(size.images.saturating_mul(IMAGE_TOKENS))
    }

    /// The estimated tokens of one message at the current ratio.
    pub fn tokens_of_message(&self, message: &Message) -> u64 {
        self.tokens_of(Size::of_message(message))
    }

    /// The current ratio of bytes per token.
    pub fn bytes_per_token(&self) -> f64 {
        self.bytes_per_token
    }

    /// Whether a report has calibrated the ratio.
    pub fn is_calibrated(&self) -> bool {
        self.calibrated
    }

    /// What has been counted.
    pub fn size(&self) -> Size {
        self.size
    }

    /// Forgets what was counted and the last report, keeping the calibrated ratio: for a
    /// conversation rebuilt from scratch (after a summary replaced its beginning, say), whose
    /// parts are then added again.
    pub fn reset(&mut self) {
        self.size = Size::default();
        self.anchor = None;
    }
}

fn clamp_ratio(r: f64) -> f64 {
    let (lo, hi) = BYTES_PER_TOKEN_RANGE;
    if r.is_nan() {
        DEFAULT_BYTES_PER_TOKEN
    } else {
        r.clamp(lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{AssistantMessage, ProviderPart, ToolCall, ToolResult};
    use proptest::prelude::*;
    use serde_json::json;

    fn tool(content: &str) -> Message {
        Message::Tool(ToolResult {
            call_id: "c1".into(),
            name: "read".into(),
            content: content.into(),
            is_error: false,
            images: Vec::new(),
        })
    }

    #[test]
    fn sizes_count_what_is_sent() {
        assert_eq!(Size::of_message(&Message::user("héllo")).bytes, 6);
        assert_eq!(Size::of_message(&tool("abc")).bytes, 2 + 4 + 3);
        let mut call = ToolCall::new("f", json!({"a": [1, 2]}));
        call.id = "x".into();
        let a = Message::Assistant(AssistantMessage {
            text: Some("ok".into()),
            tool_calls: vec![call],
            parts: vec![ProviderPart {
                provider: "anthropic".into(),
                data: json!({"t": 1}),
            }],
        });
        // "ok" + "x" + "f" + {"a":[1,2]} + {"t":1}
        assert_eq!(Size::of_message(&a).bytes, 2 + 1 + 1 + 11 + 7);
        let bad = Message::Assistant(AssistantMessage {
            text: None,
            tool_calls: vec![ToolCall::from_raw_arguments(
                "i".into(),
                "g".into(),
                "{oops",
            )],
            parts: vec![],
        });
        assert_eq!(Size::of_message(&bad).bytes, 1 + 1 + 5);
        let image = crate::image::Image::from_bytes(b"GIF89a\x01\x00").unwrap();
        let u = Message::user_with_images("see", vec![image.clone(), image]);
        assert_eq!(
            Size::of_message(&u),
            Size {
                bytes: 3,
                images: 2
            }
        );
        let spec = ToolSpec {
            name: "read".into(),
            description: "Reads".into(),
            parameters: json!({"type": "object"}),
        };
        assert_eq!(Size::of_tools(&[spec]).bytes, 4 + 5 + 17);
    }

    #[test]
    fn before_a_report_the_default_ratio_applies() {
        let mut e = TokenEstimator::new();
        assert_eq!(e.estimate(), 0);
        e.add(&Message::user("x".repeat(400)));
        assert_eq!(e.estimate(), 100);
        e.add(&Message::user("y"));
        assert_eq!(e.estimate(), 101, "a partial token rounds up");
        assert!(!e.is_calibrated());
    }

    #[test]
    fn a_report_anchors_and_calibrates() {
        let mut e = TokenEstimator::new();
        e.add(&Message::user("x".repeat(3000)));
        e.observe(1000);
        assert!(e.is_calibrated());
        assert_eq!(e.bytes_per_token(), 3.0);
        assert_eq!(e.estimate(), 1000);
        e.add(&tool(&"z".repeat(291))); // 2 + 4 + 291 = 297 bytes
        assert_eq!(e.estimate(), 1000 + 99);
        // The report counted tokens the bytes do not show (the provider's own framing): they
        // stay in the estimate.
        e.observe(1200);
        assert_eq!(e.estimate(), 1200);
        e.remove(&tool(&"z".repeat(291)));
        assert!(e.estimate() < 1200);
    }

    #[test]
    fn small_or_odd_reports_do_not_break_the_ratio() {
        let mut e = TokenEstimator::new();
        e.add(&Message::user("hi"));
        e.observe(12);
        assert!(!e.is_calibrated(), "two bytes cannot calibrate");
        assert_eq!(e.estimate(), 12);
        let mut e = TokenEstimator::new();
        e.add(&Message::user("x".repeat(1000)));
        e.observe(0);
        assert_eq!(e.bytes_per_token(), DEFAULT_BYTES_PER_TOKEN);
        e.observe(1);
        assert_eq!(e.bytes_per_token(), BYTES_PER_TOKEN_RANGE.1);
        e.observe(u64::MAX);
        assert_eq!(e.bytes_per_token(), BYTES_PER_TOKEN_RANGE.0);
        e.add(&Message::user("more"));
        assert_eq!(e.estimate(), u64::MAX);
        assert_eq!(
            TokenEstimator::with_bytes_per_token(f64::NAN).bytes_per_token(),
            4.0
        );
        assert_eq!(
            TokenEstimator::with_bytes_per_token(-3.0).bytes_per_token(),
            1.0
        );
        assert_eq!(
            TokenEstimator::with_bytes_per_token(f64::INFINITY).bytes_per_token(),
            16.0
        );
    }

    #[test]
    fn images_count_apart_from_the_ratio() {
        let image = crate::image::Image::from_bytes(b"GIF89a\x01\x00").unwrap();
        let mut e = TokenEstimator::new();
        e.add(&Message::user_with_images(
            "x".repeat(1000),
            vec![image.clone()],
        ));
        assert_eq!(e.estimate(), 250 + IMAGE_TOKENS);
        // The report's image share is taken out before calibrating.
        e.observe(500 + IMAGE_TOKENS);
        assert_eq!(e.bytes_per_token(), 2.0);
        e.add(&Message::user_with_images("", vec![image]));
        assert_eq!(e.estimate(), 500 + 2 * IMAGE_TOKENS);
    }

    #[test]
    fn reset_keeps_the_calibration() {
        let mut e = TokenEstimator::new();
        e.add(&Message::user("x".repeat(600)));
        e.observe(300);
        e.reset();
        assert_eq!(e.estimate(), 0);
        e.add(&Message::user("x".repeat(60)));
        assert_eq!(e.estimate(), 30);
    }

    fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            ".{0,200}".prop_map(Message::user),
            ".{0,50}".prop_map(Message::system),
            ".{0,500}".prop_map(|s| tool(&s)),
            (".{0,40}", "[a-z]{1,8}", ".{0,30}").prop_map(|(t, name, arg)| {
                Message::Assistant(AssistantMessage {
                    text: Some(t),
                    tool_calls: vec![ToolCall::new(name, json!({"q": arg}))],
                    parts: vec![],
                })
            }),
        ]
    }

    /// Any JSON value: every kind of number, strings with every escape and non-ASCII text,
    /// nested arrays and objects.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(|n| json!(n)),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            "(?s).{0,24}".prop_map(Value::String),
            "[\"\\\\\u{0}-\u{1f}\u{7f}/é€😀a]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("(?s).{0,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// The walk counts a value's compact encoding byte for byte, escapes included.
    #[test]
    fn json_len_counts_the_escapes_and_numbers() {
        for v in [
            json!(null),
            json!(false),
            json!(0),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(-1),
            json!(0.1),
            json!(-1.5e300),
            json!("a\"b\\c\u{0}\u{8}\t\n\u{c}\r\u{1f}\u{7f}/é😀"),
            json!({"n": [1, {"": []}], "k\n": {}}),
        ] {
            assert_eq!(
                json_len(&v),
                serde_json::to_string(&v).unwrap().len() as u64,
                "{v}"
            );
        }
    }

    proptest! {
        /// The walk gives the length of what `serde_json` writes, for any value.
        #[test]
        fn json_len_is_the_encoded_length(v in json_value()) {
            prop_assert_eq!(json_len(&v), serde_json::to_string(&v).unwrap().len() as u64);
        }

        /// Counting message by message gives what counting the whole does, with or without a
        /// report in between.
        #[test]
        fn incremental_equals_whole(
            messages in prop::collection::vec(message(), 0..30),
            cut in any::<prop::sample::Index>(),
            reported in 0u64..100_000,
        ) {
            let cut = if messages.is_empty() { 0 } else { cut.index(messages.len() + 1) };
            let mut step = TokenEstimator::new();
            for m in &messages[..cut] {
                step.add(m);
            }
            step.observe(reported);
            for m in &messages[cut..] {
                step.add(m);
            }
            let mut whole = TokenEstimator::new();
            let before: Size = messages[..cut].iter().map(Size::of_message).fold(
                Size::default(),
                |a, b| Size { bytes: a.bytes + b.bytes, images: a.images + b.images },
            );
            whole.add_size(before);
            whole.observe(reported);
            let after: u64 = messages[cut..].iter().map(|m| Size::of_message(m).bytes).sum();
            whole.add_size(Size { bytes: after, images: 0 });
            prop_assert_eq!(step.estimate(), whole.estimate());
            prop_assert_eq!(step.size(), whole.size());
            // Right after the report, the estimate is the report.
            let mut at = TokenEstimator::new();
            messages[..cut].iter().for_each(|m| at.add(m));
            at.observe(reported);
            prop_assert_eq!(at.estimate(), reported);
        }

        /// Adding never lowers the estimate, and taking out what was added restores it.
        #[test]
        fn adding_is_monotone_and_removing_undoes_it(
            base in prop::collection::vec(message(), 0..10),
            extra in prop::collection::vec(message(), 1..10),
            reported in prop::option::of(0u64..50_000),
        ) {
            let mut e = TokenEstimator::new();
            base.iter().for_each(|m| e.add(m));
            if let Some(r) = reported {
                e.observe(r);
            }
            let start = e.estimate();
            let mut last = start;
            for m in &extra {
                e.add(m);
                let now = e.estimate();
                prop_assert!(now >= last);
                last = now;
            }
            for m in extra.iter().rev() {
                e.remove(m);
            }
            prop_assert_eq!(e.estimate(), start);
        }

        /// With text whose true ratio is known, the calibrated estimate of what comes next is
        /// within a token per message of the truth.
        #[test]
        fn calibration_learns_the_ratio(
            ratio in 2u64..8,
            first in prop::collection::vec(1usize..400, 1..10),
            next in prop::collection::vec(1usize..400, 1..10),
        ) {
            let text = |tokens: usize| "a".repeat(tokens * ratio as usize);
            let mut e = TokenEstimator::new();
            let mut truth = 0u64;
            for t in &first {
                e.add(&Message::user(text(*t)));
                truth += *t as u64;
            }
            prop_assume!(e.size().bytes >= MIN_CALIBRATION_BYTES);
            e.observe(truth);
            prop_assert!((e.bytes_per_token() - ratio as f64).abs() < 1e-9);
            for t in &next {
                e.add(&Message::user(text(*t)));
                truth += *t as u64;
            }
            let estimate = e.estimate();
            prop_assert!(estimate >= truth && estimate <= truth + next.len() as u64,
                "{} vs {}", estimate, truth);
        }
    }
}
