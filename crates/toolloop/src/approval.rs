//! Approvals: which tool calls run on their own, which wait for a person's yes, and which never
//! run.
//!
//! Every call that passed the loop's checks (known tool, valid arguments, not a duplicate,
//! within budget) is weighed against [`Approvals`], a list of [`Rule`]s kept as data: a rule
//! names tools by a glob over their name, and optionally calls by a glob over the call's
//! *approval subject* ([`crate::tool::Tool::approval_subject`]: the command line of
//! `run_command`, the path of a file tool, the call's canonical JSON arguments otherwise).
//!
//! - [`Action::Allow`]: the call runs.
//! - [`Action::Deny`]: the call does not run; its result is `denied: <reason>`, which the model
//!   reads like any other result, so it can adapt.
//! - [`Action::Ask`]: the machine asks ([`crate::engine::Step::Approve`]) and the driver asks
//!   the agent's approval handler ([`crate::agent::AgentBuilder::on_approval`]). With no
//!   handler the run stops with [`crate::outcome::StopReason::AwaitingApproval`] and lists the
//!   calls in [`crate::outcome::Outcome::pending_approvals`]; a later
//!   [`crate::agent::Agent::decide_approvals`] and [`crate::agent::Agent::resume`] continue it,
//!   in this process or another, after a crash too.
//!
//! When several rules match, `deny` wins over `ask`, and `ask` over `allow`, whatever their
//! order. When none matches, [`Approvals::default`] decides, or, when it is not set, the tool's
//! own [`crate::tool::Tool::default_approval`] (allow for most tools; ask for `run_command`).
//!
//! Every decision is an input of the machine and a record of the run log
//! ([`crate::engine::Input::ApprovalDecided`]), bound to the call: its id, its tool and its
//! canonical arguments. A replay takes decisions from the log and never asks again; a decision
//! whose call differs (another tool, other arguments) is not applied, so the call is asked
//! about again. An unapproved call never runs.

use crate::message::ToolCall;
use serde::{Deserialize, Serialize};

/// What a rule does with the calls it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The call runs.
    Allow,
    /// The call waits for a person's decision.
    Ask,
    /// The call does not run; the model reads `denied: …`.
    Deny,
}

impl Action {
    /// `allow`, `ask` or `deny`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Ask => "ask",
            Action::Deny => "deny",
        }
    }
}

/// One rule: an action for the calls of the tools whose name matches `tool`, and, when
/// `subject` is set, whose approval subject matches it. Globs: `*` is any run of characters
/// (`/` and spaces included), `?` one character, `[abc]` a class, `{a,b}` alternatives; `\`
/// escapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// What to do.
    pub action: Action,
    /// A glob over the tool's name.
    pub tool: String,
    /// A glob over the call's approval subject; `None` matches every call of the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
}

/// A rule whose glob does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid approval pattern `{pattern}`: {message}")]
pub struct RuleError {
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong with it.
    pub message: String,
}

fn glob(pattern: &str) -> Result<globset::GlobMatcher, RuleError> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| RuleError {
            pattern: pattern.to_string(),
            message: e.kind().to_string(),
        })
}

impl Rule {
    /// A rule from `TOOL[:SUBJECT]` (`run_command:cargo test*`, `write_file:*.lock`,
    /// `read_*`): a glob over the tool's name, then, after the first `:`, a glob over the
    /// call's approval subject.
    pub fn parse(action: Action, spec: &str) -> Result<Rule, RuleError> {
        let (tool, subject) = match spec.split_once(':') {
            Some((t, s)) => (t, Some(s.to_string())),
            None => (spec, None),
        };
        if tool.is_empty() {
            return Err(RuleError {
                pattern: spec.to_string(),
                message: "expected TOOL or TOOL:SUBJECT, with a tool name (or glob) first".into(),
            });
        }
        let rule = Rule {
            action,
            tool: tool.to_string(),
            subject,
        };
        rule.check()?;
        Ok(rule)
    }

    /// Checks that the globs compile.
    pub fn check(&self) -> Result<(), RuleError> {
        glob(&self.tool)?;
        if let Some(s) = &self.subject {
            glob(s)?;
        }
        Ok(())
    }

    /// Whether the rule covers a call of tool `name` with approval subject `subject`. A glob
    /// that does not compile matches nothing.
    pub fn matches(&self, name: &str, subject: &str) -> bool {
        let tool = glob(&self.tool).is_ok_and(|g| g.is_match(name));
        tool && match &self.subject {
            None => true,
            Some(s) => glob(s).is_ok_and(|g| g.is_match(subject)),
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.subject {
            Some(s) => write!(f, "{} {}:{s}", self.action.as_str(), self.tool),
            None => write!(f, "{} {}", self.action.as_str(), self.tool),
        }
    }
}

/// The approval policy of a run (part of [`crate::config::LoopConfig`]). The default has no
/// rules and leaves each tool to its own default.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Approvals {
    /// The rules (see the module docs for which wins).
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// The action when no rule matches; `None`: the tool's own default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Action>,
}

/// What the policy says of one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// It runs; `rule` is the rule that allowed it (`None`: allowed by default).
    Allow {
        /// The rule, in words.
        rule: Option<String>,
    },
    /// A person decides.
    Ask,
    /// It does not run, by this rule (or the default).
    Deny {
        /// The rule, in words.
        rule: String,
    },
}

impl Approvals {
    /// No rules, and every call asked about.
    pub fn ask_all() -> Self {
        Approvals {
            rules: Vec::new(),
            default: Some(Action::Ask),
        }
    }

    /// Adds a rule.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Whether no rule and no default is set (every call gets its tool's default).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.default.is_none()
    }

    /// Whether a call of tool `name` (whose own default is `tool_default`) needs its approval
    /// subject: when a rule names the tool (it may match the subject), or when the call is not
    /// simply allowed (a person is shown the subject). The driver computes the subject only
    /// then ([`crate::toolbox::Toolbox::approval_subjects`]), and the machine refuses a
    /// response that lacks one it needs.
    pub fn weighs_subject(&self, name: &str, tool_default: Action) -> bool {
        self.default.unwrap_or(tool_default) != Action::Allow
            || self
                .rules
                .iter()
                .any(|r| glob(&r.tool).is_ok_and(|g| g.is_match(name)))
    }

    /// The verdict on a call of tool `name` with approval subject `subject`, whose tool's own
    /// default is `tool_default`.
    pub fn verdict(&self, name: &str, subject: &str, tool_default: Action) -> Verdict {
        let matching = || self.rules.iter().filter(|r| r.matches(name, subject));
        if let Some(r) = matching().find(|r| r.action == Action::Deny) {
            return Verdict::Deny {
                rule: r.to_string(),
            };
        }
        if matching().any(|r| r.action == Action::Ask) {
            return Verdict::Ask;
        }
        if let Some(r) = matching().find(|r| r.action == Action::Allow) {
            return Verdict::Allow {
                rule: Some(r.to_string()),
            };
        }
        match self.default.unwrap_or(tool_default) {
            Action::Allow => Verdict::Allow { rule: None },
            Action::Ask => Verdict::Ask,
            Action::Deny => Verdict::Deny {
                rule: match self.default {
                    Some(_) => "deny by default".into(),
                    None => format!("the tool `{name}` is denied by default"),
                },
            },
        }
    }
}

/// A call that waits for a decision: handed to the approval handler, and listed in an outcome
/// that stopped awaiting approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingApproval {
    /// The round of the call (1-based).
    pub round: u32,
    /// The call's place in the round.
    pub index: usize,
    /// The call: its id, tool and arguments, exactly as it would run.
    pub call: ToolCall,
    /// What rules match against (the command line, the path, or the canonical arguments).
    pub subject: String,
    /// Where the call waits: empty for the run's own calls; for a sub-agent's call, the
    /// agents' names from the run down (`["reviewer"]`, see [`crate::subagent`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<String>,
    /// The run whose log holds the call, for a sub-agent's call (`{parent}/{call_id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// A person's (or a handler's) answer to a [`PendingApproval`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// The call runs.
    Approve,
    /// The call does not run; the model reads `denied: <reason>`.
    Deny {
        /// Why, for the model; `None` gives a default reason.
        reason: Option<String>,
    },
}

/// Who decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum DecidedBy {
    /// A rule of the policy (in words).
    Rule {
        /// The rule.
        rule: String,
    },
    /// A person, through the approval handler or a recorded decision.
    Person,
}

/// A decision on one call, bound to it: it applies only to a call with this id, this tool and
/// these canonical arguments. Recorded in the run log before the call runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// The call id.
    pub call_id: String,
    /// The tool's name.
    pub tool: String,
    /// The call's canonical arguments ([`ToolCall::canonical_arguments`]).
    pub arguments: String,
    /// Whether the call runs.
    pub approved: bool,
    /// Why it was denied, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who decided.
    #[serde(flatten)]
    pub by: DecidedBy,
}

impl Decision {
    /// A decision on `call`.
    pub fn new(call: &ToolCall, approved: bool, reason: Option<String>, by: DecidedBy) -> Self {
        Decision {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments: call.canonical_arguments(),
            approved,
            reason,
            by,
        }
    }

    /// The decision a verdict takes by itself: `Allow` and `Deny` decide by their rule; `Ask`
    /// leaves the call to a person (`None`).
    pub fn by_rule(call: &ToolCall, verdict: &Verdict) -> Option<Self> {
        match verdict {
            Verdict::Allow { rule } => Some(Decision::new(
                call,
                true,
                None,
                DecidedBy::Rule {
                    rule: rule.clone().unwrap_or_else(|| "allow by default".into()),
                },
            )),
            Verdict::Deny { rule } => Some(Decision::new(
                call,
                false,
                None,
                DecidedBy::Rule { rule: rule.clone() },
            )),
            Verdict::Ask => None,
        }
    }

    /// A person's answer on `call`.
    pub fn by_person(call: &ToolCall, answer: Answer) -> Self {
        match answer {
            Answer::Approve => Decision::new(call, true, None, DecidedBy::Person),
            Answer::Deny { reason } => Decision::new(call, false, reason, DecidedBy::Person),
        }
    }

    /// Whether the decision is about exactly this call (id, tool and canonical arguments).
    pub fn binds(&self, call: &ToolCall) -> bool {
        self.call_id == call.id
            && self.tool == call.name
            && self.arguments == call.canonical_arguments()
    }

    /// The result the model reads for a denied call.
    pub fn denial(&self) -> String {
        let reason = match (&self.reason, &self.by) {
            (Some(r), _) if !r.trim().is_empty() => r.clone(),
            (_, DecidedBy::Rule { rule }) => {
                format!("the approval rule `{rule}` forbids this call")
            }
            (_, DecidedBy::Person) => "the user did not approve this call".into(),
        };
        format!("denied: {reason}")
    }
}

/// Why approvals could not be read or recorded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApprovalError {
    /// The run log failed.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// The call named does not wait for approval.
    #[error(
        "call {call_id} of run {run_id} does not wait for approval; waiting: {}",
        if waiting.is_empty() { "none".to_string() } else { waiting.join(", ") }
    )]
    NotWaiting {
        /// The run.
        run_id: String,
        /// The call named.
        call_id: String,
        /// The calls that do wait.
        waiting: Vec<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_tool_and_subject_globs() {
        let r = Rule::parse(Action::Allow, "run_command:cargo test*").unwrap();
        assert!(r.matches("run_command", "cargo test --workspace"));
        assert!(!r.matches("run_command", "cargo build"));
        assert!(!r.matches("write_file", "cargo test"));
        let r = Rule::parse(Action::Deny, "write_file:*.lock").unwrap();
        assert!(r.matches("write_file", "sub/dir/Cargo.lock"));
        assert!(!r.matches("write_file", "src/lib.rs"));
        let r = Rule::parse(Action::Ask, "read_*").unwrap();
        assert!(r.matches("read_file", "anything"));
        assert!(Rule::parse(Action::Ask, ":x").is_err());
        assert!(Rule::parse(Action::Ask, "a:[").is_err());
    }

    #[test]
    fn deny_beats_ask_beats_allow_then_defaults() {
        let p = Approvals::default()
            .rule(Rule::parse(Action::Allow, "run_command").unwrap())
            .rule(Rule::parse(Action::Ask, "run_command:git *").unwrap())
            .rule(Rule::parse(Action::Deny, "run_command:git push*").unwrap());
        assert_eq!(
            p.verdict("run_command", "ls", Action::Ask),
            Verdict::Allow {
                rule: Some("allow run_command".into())
            }
        );
        assert_eq!(
            p.verdict("run_command", "git status", Action::Ask),
            Verdict::Ask
        );
        assert!(matches!(
            p.verdict("run_command", "git push origin", Action::Ask),
            Verdict::Deny { .. }
        ));
        assert_eq!(p.verdict("other", "x", Action::Ask), Verdict::Ask);
        assert_eq!(
            p.verdict("other", "x", Action::Allow),
            Verdict::Allow { rule: None }
        );
        let all = Approvals::ask_all();
        assert_eq!(all.verdict("other", "x", Action::Allow), Verdict::Ask);
    }

    #[test]
    fn a_decision_binds_to_the_exact_arguments() {
        let call = |id: &str, args: serde_json::Value| {
            let mut c = ToolCall::new("run_command", args);
            c.id = id.into();
            c
        };
        let d = Decision::new(
            &call("c1", serde_json::json!({"b": 1, "a": [2]})),
            true,
            None,
            DecidedBy::Person,
        );
        assert!(d.binds(&call("c1", serde_json::json!({"a": [2], "b": 1}))));
        assert!(!d.binds(&call("c1", serde_json::json!({"a": [3], "b": 1}))));
        assert!(!d.binds(&call("c2", serde_json::json!({"b": 1, "a": [2]}))));
    }
}
