//! Provider adapters: each translates the message model to and from one wire format.
//!
//! Nothing outside an adapter knows a wire format.

#[cfg(any(test, feature = "testing"))]
use crate::model::{ApiError, ModelResponse};

#[cfg(feature = "http")]
pub mod anthropic;
#[cfg(feature = "http")]
pub mod gemini;
#[cfg(feature = "http")]
pub mod openai;
#[cfg(feature = "http")]
pub mod openai_responses;
pub mod scripted;
pub mod test_model;
#[cfg(feature = "http")]
pub use crate::transport::check_base_url;

/// What an adapter makes of one recorded response body: the response, and the error the body
/// reported (an HTTP error body, or an error event inside a stream). Used by the conformance
/// tests, which feed recorded bodies byte for byte.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decoded {
    /// What arrived (for an error, whatever came before it).
    pub response: ModelResponse,
    /// The error, if the body reported one.
    pub error: Option<ApiError>,
}
