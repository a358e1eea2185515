//! Why a command failed, and the exit code it ends with.
//!
//! Every subcommand returns `Result<ExitCode, CliError>`: `Ok` with the code of an outcome (the
//! model answered: 0; a budget stopped the run: 3; the run waits for approvals: 4; a chat quit
//! with Ctrl-C: 130), `Err` when the command could not do its job. `main` is the one place that
//! says an error (see [`report`]: `toolloop: ` and the error with its chain of sources, each
//! control character escaped) and maps it to its exit code ([`CliError::exit_code`]):
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | done (the model answered) |
//! | 1 | a failure: the model call, the store, an MCP server, an unknown workflow run, the run was cancelled |
//! | 2 | bad usage or configuration: a flag, an argument, a file a flag names, the configuration file, an unknown run |
//! | 3 | a budget or a terminal condition stopped the run (an outcome, not an error) |
//! | 4 | the run waits for approvals (an outcome, not an error) |
//! | 130 | `chat` quit with Ctrl-C (an outcome, not an error) |
//!
//! (`chat` says the error of a turn that could not run through [`report`] too, and goes on.)
//! Warnings and progress lines, which do not end the command, go through [`warn`].

use std::process::ExitCode;
use toolloop::journal::JournalError;
use toolloop_store::StoreError;

/// Exit code for bad usage or configuration.
pub(crate) const EXIT_USAGE: u8 = 2;

/// Any error, as a source.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a command failed (see the module's documentation). A variant's message says what the
/// command was doing; its source says what went wrong, and is printed after it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// Bad usage: a flag, an argument or the configuration (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// A flag's value, or the file it names, that is not what was expected (exit code 2).
    #[error("{what}")]
    Invalid {
        /// The flag (and the file), e.g. `--system-file notes.md`.
        what: String,
        /// What is wrong with it.
        #[source]
        source: BoxError,
    },
    /// A failure without a typed cause (exit code 1).
    #[error("{0}")]
    Failed(String),
    /// A failure while doing `context`, with its cause (exit code 1).
    #[error("{context}")]
    Failure {
        /// What the command was doing (may be empty: the cause says it all).
        context: String,
        /// What went wrong.
        #[source]
        source: BoxError,
    },
    /// An error while doing something that names where it happened (`[agents.NAME] model`);
    /// the exit code is the inner error's.
    #[error("{context}")]
    In {
        /// Where it happened.
        context: String,
        /// What went wrong.
        #[source]
        source: Box<CliError>,
    },
    /// Reading or writing a file, a terminal or a pipe failed (exit code 1).
    #[error("{context}")]
    Io {
        /// What the command was doing.
        context: String,
        /// The error of the operating system.
        #[source]
        source: std::io::Error,
    },
    /// The store failed (exit code 1).
    #[error("{context}")]
    Store {
        /// What the command was doing (may be empty: the store's error says it all).
        context: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A run's log failed, or names no run (exit code 2 for a run that does not exist, else 1).
    #[error("{context}")]
    Journal {
        /// What the command was doing (may be empty).
        context: String,
        /// The run log's error.
        #[source]
        source: JournalError,
    },
    /// The model's settings (flags, variables) do not make a model: checked before anything
    /// is sent (exit code 2).
    #[error(transparent)]
    ModelSettings(toolloop::model::ModelError),
    /// An MCP server failed (exit code 1).
    #[error(transparent)]
    Mcp(#[from] toolloop_mcp::McpError),
    /// A workflow did not read, check, start or resume (exit code 2 for a file that is not a
    /// workflow, one that does not check, or wrong inputs; 1 for an unknown run or a failed log).
    #[error(transparent)]
    Workflow(#[from] toolloop_workflow::WorkflowError),
}

impl CliError {
    /// A usage error: exit code 2.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        CliError::Usage(message.into())
    }

    /// A failure without a typed cause: exit code 1.
    pub(crate) fn failed(message: impl Into<String>) -> Self {
        CliError::Failed(message.into())
    }

    /// A failure while doing `context`, with its cause: exit code 1.
    pub(crate) fn failure(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        CliError::Failure {
            context: context.into(),
            source: source.into(),
        }
    }

    /// A flag's value (or its file) that is wrong: exit code 2.
    pub(crate) fn invalid(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        CliError::Invalid {
            what: what.into(),
            source: source.into(),
        }
    }

    /// An I/O failure while doing `context`: exit code 1.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CliError::Io {
            context: context.into(),
            source,
        }
    }

    /// The store's error, as it says itself.
    pub(crate) fn store(source: StoreError) -> Self {
        CliError::Store {
            context: String::new(),
            source,
        }
    }

    /// The run log's error, as it says itself.
    pub(crate) fn journal(source: JournalError) -> Self {
        CliError::Journal {
            context: String::new(),
            source,
        }
    }

    /// This error, said to have happened in `context`.
    pub(crate) fn context(self, context: impl Into<String>) -> Self {
        CliError::In {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// The exit code the command ends with (the table of the module's documentation).
    pub(crate) fn exit_code(&self) -> ExitCode {
        use toolloop_workflow::WorkflowError;
        let usage = match self {
            CliError::In { source, .. } => return source.exit_code(),
            CliError::Usage(_) | CliError::Invalid { .. } | CliError::ModelSettings(_) => true,
            CliError::Journal {
                source: JournalError::NotFound(_),
                ..
            } => true,
            CliError::Workflow(e) => {
                !matches!(e, WorkflowError::Log(_) | WorkflowError::NotFound(_))
            }
            CliError::Failed(_)
            | CliError::Failure { .. }
            | CliError::Io { .. }
            | CliError::Store { .. }
            | CliError::Journal { .. }
            | CliError::Mcp(_) => false,
        };
        if usage {
            ExitCode::from(EXIT_USAGE)
        } else {
            ExitCode::FAILURE
        }
    }
}

/// The error's message with its chain of sources, `: ` between them; a source whose text its
/// outer message already holds (many errors repeat their source) is not repeated.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let said = s.to_string();
        if !said.is_empty() && !text.contains(&said) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&said);
        }
        source = s.source();
    }
    text
}

/// Says `error` on stderr, as `toolloop: ` and its chain of sources ([`chain`]), each control
/// character escaped (a server's or a model's text is in it; newlines are kept, so a list of
/// problems reads as one), and returns its exit code. The one place the command says an error.
pub(crate) fn report(error: &CliError) -> ExitCode {
    eprintln!("toolloop: {}", crate::terminal::escape(&chain(error), true));
    error.exit_code()
}

/// Says a warning or a progress note on stderr (`toolloop: ` and `message`), each control
/// character escaped but newlines: for what does not end the command.
pub(crate) fn warn(message: impl std::fmt::Display) {
    eprintln!(
        "toolloop: {}",
        crate::terminal::escape(&message.to_string(), true)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_names_each_cause_once() {
        let e = CliError::invalid(
            "--system-file notes.md",
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        );
        assert_eq!(chain(&e), "--system-file notes.md: no such file");
        assert_eq!(e.exit_code(), ExitCode::from(EXIT_USAGE));
        // The store's message already holds its source: said once.
        let e = CliError::store(StoreError::SessionBusy {
            session: "s".into(),
            holder: "pid 1".into(),
        });
        assert_eq!(
            chain(&e),
            "session `s` is in use by pid 1; try again when that run has finished"
        );
        assert_eq!(e.exit_code(), ExitCode::FAILURE);
    }

    #[test]
    fn an_unknown_run_is_a_usage_error_and_a_broken_log_a_failure() {
        let unknown = CliError::journal(JournalError::NotFound("run_x".into()));
        assert_eq!(unknown.exit_code(), ExitCode::from(EXIT_USAGE));
        let held = CliError::journal(JournalError::Locked {
            run_id: "run_x".into(),
            holder: "pid 2".into(),
        });
        assert_eq!(held.exit_code(), ExitCode::FAILURE);
        let log = CliError::Workflow(toolloop_workflow::WorkflowError::Log("disk".into()));
        assert_eq!(log.exit_code(), ExitCode::FAILURE);
        let invalid = CliError::Workflow(toolloop_workflow::WorkflowError::Invalid(vec![
            "step `a`: no prompt".into(),
        ]));
        assert_eq!(invalid.exit_code(), ExitCode::from(EXIT_USAGE));
    }
}
