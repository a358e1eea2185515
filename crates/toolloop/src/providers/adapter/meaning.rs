//! What an adapter's errors mean for the run, given as data: [`ErrorMeaning`] holds the
//! adapter's readers of its API's messages, and one [`ErrorMeaning::classify`] serves every
//! adapter.

use crate::context::ContextOverflow;
use crate::model::{ApiError, ModelError};

/// How an adapter reads its API's errors: which say the request does not fit the context
/// window (and with which counts), and which say the server or model takes no tools.
#[derive(Clone, Copy)]
pub(crate) struct ErrorMeaning {
    /// The refusal for the context's size an error reports, with the counts it gives, if it is
    /// one.
    pub(crate) context_overflow: fn(&ApiError) -> Option<ContextOverflow>,
    /// Whether an error says the server or model does not accept a tool catalog (the signal for
    /// prompt-based tool calling).
    pub(crate) tools_unsupported: fn(&ApiError) -> bool,
}

impl ErrorMeaning {
    /// Reads what an error means for the run: an API error that says the request does not fit
    /// the context window becomes [`ModelError::ContextOverflow`], one that says tools are
    /// unsupported [`ModelError::ToolsUnsupported`]; anything else is as it was.
    pub(crate) fn classify(&self, e: ModelError) -> ModelError {
        match e {
            ModelError::Api(a) => match (self.context_overflow)(&a) {
                Some(o) => ModelError::ContextOverflow(o),
                None if (self.tools_unsupported)(&a) => ModelError::ToolsUnsupported(a.message),
                None => ModelError::Api(a),
            },
            other => other,
        }
    }
}

/// For an API whose every model takes tools: no error says otherwise.
pub(crate) fn tools_always_supported(_: &ApiError) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, message: &str) -> ApiError {
        ApiError {
            status,
            error_type: None,
            code: None,
            message: message.into(),
            retryable: false,
            retry_after: None,
        }
    }

    const MEANING: ErrorMeaning = ErrorMeaning {
        context_overflow: |e| {
            e.message
                .contains("too long")
                .then(|| ContextOverflow::new(e.status, None, e.message.clone()))
        },
        tools_unsupported: |e| e.message.contains("no tools"),
    };

    #[test]
    fn each_error_is_read_by_the_adapters_readers_the_overflow_first() {
        let overflow = MEANING.classify(ModelError::Api(api(400, "too long, and no tools")));
        assert!(
            matches!(overflow, ModelError::ContextOverflow(_)),
            "{overflow:?}"
        );
        let tools = MEANING.classify(ModelError::Api(api(400, "no tools here")));
        assert!(
            matches!(&tools, ModelError::ToolsUnsupported(m) if m == "no tools here"),
            "{tools:?}"
        );
        let other = MEANING.classify(ModelError::Api(api(400, "bad request")));
        assert!(matches!(other, ModelError::Api(a) if a.message == "bad request"));
        let transport = MEANING.classify(ModelError::Other("too long".into()));
        assert!(
            matches!(transport, ModelError::Other(_)),
            "not an API error: as it was"
        );
        let always = ErrorMeaning {
            tools_unsupported: tools_always_supported,
            ..MEANING
        };
        assert!(matches!(
            always.classify(ModelError::Api(api(400, "no tools"))),
            ModelError::Api(_)
        ));
    }
}
