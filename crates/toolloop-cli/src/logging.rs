//! What the command tells about itself: diagnostics on stderr through `tracing` (warnings only
//! by default, `-v` info, `-vv` debug, `-vvv` trace; `RUST_LOG` sets the filter exactly), and,
//! with the `otel` feature, OpenTelemetry traces sent over OTLP/HTTP.
//!
//! Traces are off unless `--otel` is given or `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and
//! `OTEL_SDK_DISABLED` is not `true`). Spans follow the GenAI semantic conventions:
//! `invoke_agent` for a run, `chat` for each model call, `execute_tool` for each tool call.
//! Prompts, answers and tool arguments are left out unless `--otel-content` is given.

use std::sync::{Arc, RwLock};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The flags for traces.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct TraceArgs {
    /// Send OpenTelemetry traces over OTLP/HTTP (JSON) to OTEL_EXPORTER_OTLP_ENDPOINT
    /// (default http://localhost:4318); setting that variable turns traces on too.
    #[arg(long, global = true)]
    pub otel: bool,
    /// Put message content (prompts, answers, tool arguments and results) in the traces.
    #[arg(long, global = true)]
    pub otel_content: bool,
}

/// Keeps the trace exporter alive; dropping it sends what is left.
pub(crate) struct Guard {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            crate::error::warn(format!("could not send the last traces: {e}"));
        }
    }
}

/// The secrets the command was configured with that a library may repeat in its log lines (the
/// header values of MCP servers, which a server's 401 can echo into rmcp's errors).
/// Made in `main`, given to the log's writer ([`init`]) and kept in [`crate::cx::Cx`].
#[derive(Clone, Default)]
pub(crate) struct LogSecrets(Arc<RwLock<Option<toolloop::redact::Redactor>>>);

impl LogSecrets {
    /// Keeps `secrets` out of every line logged on stderr from now on.
    pub(crate) fn add(&self, secrets: impl IntoIterator<Item = String>) {
        let Ok(mut slot) = self.0.write() else {
            return;
        };
        let redactor = slot.get_or_insert_with(toolloop::redact::Redactor::new);
        for s in secrets {
            redactor.add_secret(&s);
        }
    }
}

/// The stderr of the log: each event is gathered, then written with the secrets
/// ([`LogSecrets::add`]) replaced.
struct RedactedStderr(LogSecrets);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactedStderr {
    type Writer = EventText;

    fn make_writer(&'a self) -> Self::Writer {
        EventText(Vec::new(), self.0.clone())
    }
}

/// One event's text, written to stderr when dropped.
struct EventText(Vec<u8>, LogSecrets);

impl std::io::Write for EventText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventText {
    fn drop(&mut self) {
        use std::io::Write;
        let redacted = self.1.0.read().ok().and_then(|r| {
            r.as_ref()
                .filter(|r| !r.is_empty())
                .map(|r| r.redact(&String::from_utf8_lossy(&self.0)).into_bytes())
        });
        let _ = std::io::stderr().write_all(redacted.as_deref().unwrap_or(&self.0));
    }
}

fn stderr_filter(verbose: u8) -> EnvFilter {
    match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => {
            EnvFilter::try_new(spec.trim()).unwrap_or_else(|e| {
                crate::error::warn(format!("RUST_LOG: {e}; logging warnings only"));
                EnvFilter::new("warn")
            })
        }
        _ => EnvFilter::new(match verbose {
            0 => "warn",
            1 => "warn,toolloop=info,toolloop_store=info,toolloop_tools=info",
            2 => "info,toolloop=debug,toolloop_store=debug,toolloop_tools=debug",
            _ => "trace",
        }),
    }
}

/// A short line per event, for people: `toolloop: ` (and the level, below info), the message,
/// then the event's own fields as `name=value`; the spans' fields (for the exporters) are left
/// out. Values are escaped: they may quote a server or a model.
struct Human;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Human
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error: ",
            tracing::Level::WARN => "warning: ",
            tracing::Level::INFO => "",
            tracing::Level::DEBUG => "debug: ",
            tracing::Level::TRACE => "trace: ",
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = crate::terminal::escape(&fields.message, false);
        write!(writer, "toolloop: {level}{message}")?;
        for (name, value) in &fields.rest {
            write!(writer, " {name}={}", crate::terminal::escape(value, false))?;
        }
        writeln!(writer)
    }
}

/// An event's message and its other fields, as text.
#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(&'static str, String)>,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else if value.chars().any(char::is_whitespace) || value.is_empty() {
            self.rest.push((field.name(), format!("{value:?}")));
        } else {
            self.rest.push((field.name(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.record_str(field, &text);
        }
    }
}

/// Whether traces are asked for.
fn traces_wanted(args: &TraceArgs) -> bool {
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim() == "true");
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_ok_and(|v| !v.trim().is_empty());
    !disabled && (args.otel || endpoint)
}

/// Installs the subscriber for the command's lifetime. Call before the async runtime starts
/// (the trace exporter has its own thread).
pub(crate) fn init(verbose: u8, traces: &TraceArgs, secrets: &LogSecrets) -> Guard {
    // Up to -vv, one short line per event, without the spans' fields (they are for the
    // exporters); -vvv (or RUST_LOG) shows everything, spans and targets included.
    let everything = verbose >= 3 || std::env::var("RUST_LOG").is_ok_and(|v| !v.trim().is_empty());
    let stderr = if everything {
        tracing_subscriber::fmt::layer()
            .compact()
            .with_writer(RedactedStderr(secrets.clone()))
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(true)
            .with_filter(stderr_filter(verbose))
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .event_format(Human)
            .with_writer(RedactedStderr(secrets.clone()))
            .with_filter(stderr_filter(verbose))
            .boxed()
    };
    let registry = tracing_subscriber::registry().with(stderr);
    #[cfg(feature = "otel")]
    if traces_wanted(traces) {
        match otel::provider() {
            Ok(provider) => {
                let layer = otel::layer(&provider, traces.otel_content);
                let _ = registry.with(layer).try_init();
                return Guard {
                    provider: Some(provider),
                };
            }
            Err(e) => crate::error::warn(format!("no traces: {e}")),
        }
    }
    #[cfg(not(feature = "otel"))]
    if traces_wanted(traces) {
        crate::error::warn("no traces: this build has no OpenTelemetry (cargo feature `otel`)");
    }
    let _ = registry.try_init();
    Guard {
        #[cfg(feature = "otel")]
        provider: None,
    }
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{LevelFilter, Targets};

    /// The tracer provider, exporting in batches over OTLP/HTTP with JSON bodies (the endpoint,
    /// headers and timeouts from the standard `OTEL_EXPORTER_OTLP_*` variables).
    pub(super) fn provider() -> Result<SdkTracerProvider, String> {
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson);
        if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
            && std::env::var_os("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
        {
            exporter = exporter.with_endpoint("http://localhost:4318/v1/traces");
        }
        let exporter = exporter.build().map_err(|e| e.to_string())?;
        let service = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| "toolloop".into());
        Ok(SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(service).build())
            .build())
    }

    /// The layer that turns the engine's GenAI spans into OpenTelemetry spans; content events
    /// (target `toolloop::genai::content`) only when asked for.
    pub(super) fn layer<S>(provider: &SdkTracerProvider, content: bool) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let tracer = provider.tracer("toolloop");
        let mut targets = Targets::new()
            .with_target("toolloop::genai", LevelFilter::INFO)
            .with_target("toolloop::genai::content", LevelFilter::OFF);
        if content {
            targets = targets.with_target("toolloop::genai::content", LevelFilter::TRACE);
        }
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(targets)
    }
}
