//! An MCP server's tool as a [`toolloop::tool::Tool`], and how its results read.

use crate::server::McpServer;
use async_trait::async_trait;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents, ToolAnnotations};
use serde_json::Value;
use std::sync::Arc;
use toolloop::tool::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};

/// A tool of an MCP server. The model sees `name` (the server's name for it, or a prefixed one:
/// see [`crate::McpTools`]); the call goes to the server under its own name.
pub struct McpTool {
    server: Arc<McpServer>,
    name: String,
    remote: String,
    description: String,
    parameters: Value,
    side_effect: SideEffect,
    annotations: Option<ToolAnnotations>,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.name)
            .field("server", &self.server.name())
            .field("remote", &self.remote)
            .finish()
    }
}

/// What a tool's annotations say it changes: `readOnlyHint` makes it read-only (parallel-safe,
/// run again on resume), else `idempotentHint` idempotent (run again on resume), else
/// side-effecting (never repeated silently). The hints are the server's word: a server you do
/// not trust should not be configured at all.
pub fn side_effect_of(annotations: Option<&ToolAnnotations>) -> SideEffect {
    match annotations {
        Some(a) if a.read_only_hint == Some(true) => SideEffect::ReadOnly,
        Some(a) if a.idempotent_hint == Some(true) => SideEffect::Idempotent,
        _ => SideEffect::SideEffecting,
    }
}

impl McpTool {
    /// The tool `tool` of `server`, offered as `name`.
    pub fn new(server: Arc<McpServer>, tool: &rmcp::model::Tool, name: String) -> Self {
        let description = tool
            .description
            .as_deref()
            .filter(|d| !d.trim().is_empty())
            .map(str::to_string)
            .or_else(|| tool.title.clone())
            .unwrap_or_else(|| format!("Tool `{}` of MCP server `{}`.", tool.name, server.name()));
        let mut parameters = Value::Object((*tool.input_schema).clone());
        if parameters.get("type").is_none() {
            parameters["type"] = Value::String("object".into());
        }
        McpTool {
            side_effect: side_effect_of(tool.annotations.as_ref()),
            annotations: tool.annotations.clone(),
            remote: tool.name.to_string(),
            server,
            name,
            description,
            parameters,
        }
    }

    /// The server.
    pub fn server(&self) -> &Arc<McpServer> {
        &self.server
    }

    /// The server's name for the tool.
    pub fn remote_name(&self) -> &str {
        &self.remote
    }

    /// The tool's annotations, as the server gave them.
    pub fn annotations(&self) -> Option<&ToolAnnotations> {
        self.annotations.as_ref()
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn parameters(&self) -> &Value {
        &self.parameters
    }
    fn parallel_safe(&self) -> bool {
        self.side_effect == SideEffect::ReadOnly
    }
    fn side_effect(&self) -> SideEffect {
        self.side_effect
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let result = self.server.call_tool(&self.remote, args, &ctx).await?;
        to_output(result)
    }
}

/// How a tool result reads for the model: the text parts joined by newlines as the message,
/// structured content as the data, and the images (image parts, and embedded resources that are
/// images: PNG, JPEG, GIF or WebP, at most [`toolloop::image::Image::MAX_BYTES`] each) sent
/// with the result for the model to see, each announced by a line in the message. Other parts
/// read as a line: an image of another type or audio describes itself; an embedded resource
/// reads as its URI and text, or a line describing a binary one; a resource link as its URI,
/// name and description. A result with `isError` is a failed call carrying the same message.
pub fn to_output(result: CallToolResult) -> Result<ToolOutput, ToolError> {
    let mut images = Vec::new();
    let parts: Vec<String> = result
        .content
        .iter()
        .map(|block| match image_of(block) {
            Some(image) => {
                let line = format!("[image {}: {}]", images.len() + 1, image.describe());
                images.push(image);
                line
            }
            None => describe(block),
        })
        .collect();
    let message = parts.join("\n");
    let data = result.structured_content;
    if result.is_error == Some(true) {
        let message = if message.trim().is_empty() {
            "the tool reported an error (without a message)".to_string()
        } else {
            message
        };
        return Err(ToolError {
            message,
            retryable: false,
            data,
            spent: None,
        });
    }
    Ok(ToolOutput {
        message,
        data,
        images,
        ..ToolOutput::default()
    })
}

/// The image a part holds, when a provider takes it: an image part, or an embedded resource
/// whose bytes are an image.
fn image_of(block: &ContentBlock) -> Option<toolloop::image::Image> {
    let data = match block {
        ContentBlock::Image(i) => &i.data,
        ContentBlock::Resource(r) => match &r.resource {
            ResourceContents::BlobResourceContents {
                blob, mime_type, ..
            } if mime_type
                .as_deref()
                .is_some_and(|m| m.starts_with("image/")) =>
            {
                blob
            }
            _ => return None,
        },
        _ => return None,
    };
    toolloop::image::Image::from_base64(data).ok()
}

fn describe(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(t) => t.text.clone(),
        ContentBlock::Image(i) => format!(
            "[image: {}, {} bytes; not shown: not a PNG, JPEG, GIF or WebP image]",
            i.mime_type,
            base64_len(&i.data)
        ),
        ContentBlock::Audio(a) => format!(
            "[audio: {}, {} bytes; not shown]",
            a.mime_type,
            base64_len(&a.data)
        ),
        ContentBlock::Resource(r) => match &r.resource {
            ResourceContents::TextResourceContents {
                uri,
                mime_type,
                text,
                ..
            } => format!(
                "[resource {uri}{}]\n{text}",
                mime_type
                    .as_deref()
                    .map(|m| format!(", {m}"))
                    .unwrap_or_default()
            ),
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => format!(
                "[resource {uri}: {}, {} bytes; not shown]",
                mime_type.as_deref().unwrap_or("binary"),
                base64_len(blob)
            ),
            _ => "[a resource of a kind toolloop does not read]".to_string(),
        },
        ContentBlock::ResourceLink(link) => {
            let mut s = format!("[resource link {} ({})", link.uri, link.name);
            if let Some(d) = &link.description {
                s.push_str(": ");
                s.push_str(d);
            }
            s.push(']');
            s
        }
        #[allow(unreachable_patterns)]
        _ => "[content of a kind toolloop does not read]".to_string(),
    }
}

/// The decoded size of base64 text.
fn base64_len(data: &str) -> usize {
    let n = data.trim_end_matches('=').len();
    n * 3 / 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(v: Value) -> CallToolResult {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn results_read_as_text_with_structured_data() {
        let out = to_output(result(json!({
            "content": [
                {"type": "text", "text": "hello"},
                {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "mimeType": "text/plain", "text": "inside"}},
                {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAAA"}},
                {"type": "resource_link", "uri": "file:///c", "name": "c", "description": "a file"},
                // GIF bytes declared as PNG: the bytes decide.
                {"type": "image", "data": "R0lGODlhAQA=", "mimeType": "image/png"},
                {"type": "image", "data": "PHN2Zy8+", "mimeType": "image/svg+xml"},
                {"type": "resource", "resource": {"uri": "file:///d.png", "mimeType": "image/png", "blob": "iVBORw0KGgo="}}
            ],
            "structuredContent": {"n": 3}
        })))
        .unwrap();
        assert_eq!(
            out.message,
            "hello\n[image 1: image/png, 8 bytes]\n[resource file:///a.txt, text/plain]\ninside\n\
             [resource file:///b.bin: binary, 3 bytes; not shown]\n[resource link file:///c (c): a file]\n\
             [image 2: image/gif, 8 bytes]\n\
             [image: image/svg+xml, 6 bytes; not shown: not a PNG, JPEG, GIF or WebP image]\n\
             [image 3: image/png, 8 bytes]"
        );
        assert_eq!(out.data, Some(json!({"n": 3})));
        let types: Vec<_> = out.images.iter().map(|i| i.media_type().unwrap()).collect();
        assert_eq!(types, ["image/png", "image/gif", "image/png"]);
    }

    #[test]
    fn is_error_is_a_failed_call_the_model_reads() {
        let e = to_output(result(json!({
            "content": [{"type": "text", "text": "no such file"}],
            "isError": true
        })))
        .unwrap_err();
        assert_eq!(e.message, "no such file");
        assert!(!e.retryable);
        let e = to_output(result(json!({"content": [], "isError": true}))).unwrap_err();
        assert!(e.message.contains("error"));
    }

    #[test]
    fn annotations_decide_side_effects() {
        let a = |v: Value| -> ToolAnnotations { serde_json::from_value(v).unwrap() };
        assert_eq!(
            side_effect_of(Some(&a(json!({"readOnlyHint": true})))),
            SideEffect::ReadOnly
        );
        assert_eq!(
            side_effect_of(Some(&a(
                json!({"readOnlyHint": false, "idempotentHint": true})
            ))),
            SideEffect::Idempotent
        );
        assert_eq!(
            side_effect_of(Some(&a(json!({"destructiveHint": true})))),
            SideEffect::SideEffecting
        );
        assert_eq!(side_effect_of(None), SideEffect::SideEffecting);
    }
}
