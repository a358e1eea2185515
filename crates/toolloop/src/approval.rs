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
//! A tool gives its subject in its normal form, with other spellings of the same call beside
//! it ([`Subject`]): the file tools give the root-relative path the call will touch, with `.`,
//! `//` and trailing `/` worked out and symbolic links resolved, and the path as given beside
//! it; `run_command` gives the command line as given, with the program by its base name, by
//! the file it resolves to, and the commands a launcher such as `env` or `busybox` would run
//! beside it. `allow` rules match the subject only, and case-sensitively; `deny` and `ask`
//! rules match the subject and every other spelling, ignoring case. A call whose subject the
//! tool cannot tell for sure (a path that does not resolve, a shell script) is matched by every
//! `deny` and `ask` rule of its tool, whatever their subject glob: in doubt, deny and ask win.
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
/// `subject` is set, whose approval subject matches it (see the module docs for which
/// spellings each action matches). Globs: `*` is any run of characters (`/` and spaces
/// included), `?` one character, `[abc]` a class, `{a,b}` alternatives; `\` escapes. A glob
/// longer than [`MAX_GLOB_BYTES`] or too complex to compile is refused.
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

/// The longest glob a rule (or a tool such as `search_files`) accepts, in bytes.
pub const MAX_GLOB_BYTES: usize = 4096;

/// How a glob compiles: as given, or ignoring case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Sensitive,
    Insensitive,
}

fn glob(pattern: &str, case: Case) -> Result<globset::GlobSet, RuleError> {
    let error = |message: String| RuleError {
        pattern: pattern.to_string(),
        message,
    };
    let mut builder = globset::GlobBuilder::new(pattern);
    builder
        .literal_separator(false)
        .backslash_escape(true)
        .case_insensitive(case == Case::Insensitive);
    compile_glob(&builder, pattern).map_err(error)
}

/// Compiles one glob into a matcher, refusing (rather than panicking on) a glob longer than
/// [`MAX_GLOB_BYTES`] or one whose matcher would be too large. `builder` holds `pattern` and
/// its options. The error says what is wrong, without the pattern.
pub fn compile_glob(
    builder: &globset::GlobBuilder<'_>,
    pattern: &str,
) -> Result<globset::GlobSet, String> {
    if pattern.len() > MAX_GLOB_BYTES {
        return Err(format!(
            "the pattern is {} bytes long; at most {MAX_GLOB_BYTES} are accepted",
            pattern.len()
        ));
    }
    let glob = builder.build().map_err(|e| e.kind().to_string())?;
    // A set of one: it returns an error where `Glob::compile_matcher` would panic.
    globset::GlobSetBuilder::new()
        .add(glob)
        .build()
        .map_err(|_| "the pattern is too complex to match (too many wildcards)".to_string())
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
        glob(&self.tool, Case::Sensitive)?;
        if let Some(s) = &self.subject {
            glob(s, Case::Insensitive)?;
        }
        Ok(())
    }

    /// Whether the rule's tool glob matches the tool `name` (whatever the call's subject).
    pub fn names_tool(&self, name: &str) -> bool {
        glob(&self.tool, Case::Sensitive).is_ok_and(|g| g.is_match(name))
    }

    /// Whether the rule covers a call of tool `name` with approval subject `subject` (a
    /// subject of one spelling, known for sure). A glob that does not compile matches nothing.
    pub fn matches(&self, name: &str, subject: &str) -> bool {
        self.covers(name, &Subject::from(subject))
    }

    /// Whether the rule covers a call of tool `name` with approval subject `subject`: an
    /// `allow` rule when its subject glob matches [`Subject::text`] (case-sensitively); a
    /// `deny` or `ask` rule when it matches the text or any of [`Subject::aliases`] (ignoring
    /// case), or when the subject is [`Subject::uncertain`]. A glob that does not compile
    /// matches nothing.
    pub fn covers(&self, name: &str, subject: &Subject) -> bool {
        if !self.names_tool(name) {
            return false;
        }
        let Some(pattern) = &self.subject else {
            return true;
        };
        if self.action == Action::Allow {
            return glob(pattern, Case::Sensitive).is_ok_and(|g| g.is_match(&subject.text));
        }
        if subject.uncertain.is_some() {
            return true;
        }
        glob(pattern, Case::Insensitive).is_ok_and(|g| {
            g.is_match(&subject.text) || subject.aliases.iter().any(|a| g.is_match(a))
        })
    }
}

/// What approval rules match for one call ([`crate::tool::Tool::approval_subject`]).
///
/// Serialized (in a run log's `model_responded` records, in a saved state) as a plain string
/// when it is one spelling known for sure, the form earlier logs kept, and otherwise as an
/// object with `text`, `aliases` and `uncertain`; both forms load.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "SubjectForm", into = "SubjectForm")]
pub struct Subject {
    /// The subject in the tool's normal form: for a file tool the root-relative path the call
    /// will touch, links resolved; for `run_command` the command line as given. Every rule
    /// matches it, and it is what a person asked about sees.
    pub text: String,
    /// Other spellings of the same call (the path as given, the program by its base name or by
    /// the file it resolves to, the command a launcher runs): `deny` and `ask` rules match
    /// them too, `allow` rules do not.
    pub aliases: Vec<String>,
    /// Set, with the reason, when the tool cannot tell for sure what the call will touch (a
    /// path that does not resolve, a shell script): every `deny` and `ask` rule of the tool
    /// then matches the call.
    pub uncertain: Option<String>,
    /// Set when only a person may approve the call ([`crate::tool::Tool::approval_required`],
    /// such as `run_command` asked to run outside its sandbox): a rule or default that would
    /// allow it asks instead (a rule that denies it still wins). The driver sets it
    /// ([`crate::toolbox::Toolbox::approval_subjects`]), since the machine never asks a tool.
    pub person: bool,
}

/// How a [`Subject`] is kept: a plain string (one spelling, known for sure; the only form
/// logs kept before subjects had other spellings), or the whole of it.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum SubjectForm {
    Text(String),
    Full {
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        aliases: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uncertain: Option<String>,
        #[serde(default, skip_serializing_if = "is_false")]
        person: bool,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl From<SubjectForm> for Subject {
    fn from(form: SubjectForm) -> Self {
        match form {
            SubjectForm::Text(text) => Subject::new(text),
            SubjectForm::Full {
                text,
                aliases,
                uncertain,
                person,
            } => Subject {
                text,
                aliases,
                uncertain,
                person,
            },
        }
    }
}

impl From<Subject> for SubjectForm {
    fn from(s: Subject) -> Self {
        if s.aliases.is_empty() && s.uncertain.is_none() && !s.person {
            SubjectForm::Text(s.text)
        } else {
            SubjectForm::Full {
                text: s.text,
                aliases: s.aliases,
                uncertain: s.uncertain,
                person: s.person,
            }
        }
    }
}

impl Subject {
    /// A subject of one spelling, known for sure.
    pub fn new(text: impl Into<String>) -> Self {
        Subject {
            text: text.into(),
            ..Subject::default()
        }
    }

    /// Adds another spelling (ignored when it repeats one already there).
    pub fn alias(mut self, alias: impl Into<String>) -> Self {
        let alias = alias.into();
        if alias != self.text && !self.aliases.contains(&alias) {
            self.aliases.push(alias);
        }
        self
    }

    /// Marks the subject as uncertain, for `why`.
    pub fn uncertain(mut self, why: impl Into<String>) -> Self {
        self.uncertain = Some(why.into());
        self
    }

    /// Marks the call as one only a person may approve ([`Subject::person`]).
    pub fn needs_person(mut self) -> Self {
        self.person = true;
        self
    }
}

impl From<String> for Subject {
    fn from(text: String) -> Self {
        Subject::new(text)
    }
}

impl From<&str> for Subject {
    fn from(text: &str) -> Self {
        Subject::new(text)
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
            || self.rules.iter().any(|r| r.names_tool(name))
    }

    /// The verdict on a call of tool `name` with approval subject `subject` (of one spelling,
    /// known for sure), whose tool's own default is `tool_default`.
    pub fn verdict(&self, name: &str, subject: &str, tool_default: Action) -> Verdict {
        self.verdict_for(name, &Subject::from(subject), tool_default)
    }

    /// The verdict on a call of tool `name` with approval subject `subject`, whose tool's own
    /// default is `tool_default` (see the module docs for which spellings each rule matches).
    pub fn verdict_for(&self, name: &str, subject: &Subject, tool_default: Action) -> Verdict {
        let matching = || self.rules.iter().filter(|r| r.covers(name, subject));
        if let Some(r) = matching().find(|r| r.action == Action::Deny) {
            let rule = match &subject.uncertain {
                // The rule's glob may not match the subject: say why it applies.
                Some(why) if !r.matches(name, &subject.text) => {
                    format!("{r} (which applies because {why})")
                }
                _ => r.to_string(),
            };
            return Verdict::Deny { rule };
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

impl PendingApproval {
    /// The event that says this call waits for a person's approval
    /// ([`Event::ApprovalRequested`](crate::event::Event::ApprovalRequested)), as a driver
    /// emits it before it asks.
    pub fn requested(&self) -> crate::event::Event {
        crate::event::Event::ApprovalRequested {
            round: self.round,
            call: self.call.clone(),
            subject: self.subject.clone(),
        }
    }
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
    use serde_json::json;

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
    fn deny_and_ask_match_every_spelling_and_allow_the_subject_only() {
        let p = Approvals::default()
            .rule(Rule::parse(Action::Allow, "write_file").unwrap())
            .rule(Rule::parse(Action::Deny, "write_file:*.lock").unwrap())
            .rule(Rule::parse(Action::Ask, "write_file:src/*").unwrap())
            .rule(Rule::parse(Action::Allow, "run_command:cargo test*").unwrap());
        // Another spelling of a denied path, and of an asked one.
        let link = Subject::new("notes.txt").alias("Cargo.lock");
        assert!(matches!(
            p.verdict_for("write_file", &link, Action::Allow),
            Verdict::Deny { .. }
        ));
        let dotted = Subject::new("x")
            .alias("./src/main.rs")
            .alias("src/main.rs");
        assert_eq!(
            p.verdict_for("write_file", &dotted, Action::Allow),
            Verdict::Ask
        );
        // Case: deny and ask ignore it.
        assert!(matches!(
            p.verdict_for("write_file", &Subject::new("CARGO.LOCK"), Action::Allow),
            Verdict::Deny { .. }
        ));
        // Allow matches the subject only, and its case: a spelling does not widen it.
        let allowed = |s: &Subject| {
            matches!(
                p.verdict_for("run_command", s, Action::Ask),
                Verdict::Allow { rule: Some(_) }
            )
        };
        assert!(allowed(&Subject::new("cargo test -q")));
        assert!(!allowed(&Subject::new("./cargo test").alias("cargo test")));
        assert!(!allowed(&Subject::new("CARGO test")));
        // In doubt, every deny and ask rule of the tool applies, and the denial says why.
        let unsure = Subject::new("elsewhere").uncertain("it does not resolve");
        match p.verdict_for("write_file", &unsure, Action::Allow) {
            Verdict::Deny { rule } => {
                assert_eq!(
                    rule,
                    "deny write_file:*.lock (which applies because it does not resolve)"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            p.verdict_for(
                "run_command",
                &Subject::new("x").uncertain("?"),
                Action::Allow
            ),
            Verdict::Allow { rule: None },
            "only the rules of the tool apply"
        );
    }

    #[test]
    fn a_subject_of_one_spelling_is_kept_as_a_string_and_both_forms_load() {
        // One spelling, known for sure: a plain string, as logs kept subjects before.
        let plain = Subject::new("git status");
        assert_eq!(serde_json::to_value(&plain).unwrap(), json!("git status"));
        let loaded: Subject = serde_json::from_value(json!("git status")).unwrap();
        assert_eq!(loaded, plain);
        // Other spellings, or doubt: the whole of it, which reads back the same.
        let full = Subject::new("src/main.rs")
            .alias("./src//main.rs")
            .uncertain("a link does not resolve");
        let value = serde_json::to_value(&full).unwrap();
        assert_eq!(
            value,
            json!({"text": "src/main.rs", "aliases": ["./src//main.rs"],
                   "uncertain": "a link does not resolve"})
        );
        assert_eq!(serde_json::from_value::<Subject>(value).unwrap(), full);
        let only_text: Subject = serde_json::from_value(json!({"text": "x"})).unwrap();
        assert_eq!(only_text, Subject::new("x"));
        // A call only a person may approve: kept as an object with `person`, which reads back.
        let person = Subject::new("rm -rf build").needs_person();
        let value = serde_json::to_value(&person).unwrap();
        assert_eq!(value, json!({"text": "rm -rf build", "person": true}));
        assert_eq!(serde_json::from_value::<Subject>(value).unwrap(), person);
        // Anything else is refused, not guessed at.
        assert!(serde_json::from_value::<Subject>(json!(3)).is_err());
        assert!(serde_json::from_value::<Subject>(json!({"aliases": ["x"]})).is_err());
    }

    #[test]
    fn absurd_globs_are_refused_not_panicked_on() {
        let stars = "*".repeat(100_000);
        let e = Rule::parse(Action::Allow, &format!("write_file:{stars}")).unwrap_err();
        assert!(e.message.contains("at most 4096"), "{e}");
        // Up to the limit, many wildcards compile and match.
        let many = "a*".repeat(2000);
        let r = Rule::parse(Action::Deny, &format!("x:{many}")).unwrap();
        assert!(r.matches("x", &"a".repeat(2000)));
        assert!(!r.matches("x", &"a".repeat(1999)));
        assert!(
            !Rule {
                action: Action::Deny,
                tool: "x".into(),
                subject: Some(stars),
            }
            .matches("x", "a")
        );
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
