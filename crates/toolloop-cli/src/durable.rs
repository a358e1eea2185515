//! Every run the command makes is logged to the store, so it can be resumed; `--session`
//! continues a named conversation.

use crate::CliError;
use crate::args::{DurabilityArg, DurableArgs, StoreArgs};
use crate::cx::Cx;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use toolloop::agent::Agent;
use toolloop::journal::{Journal, JournalError, new_run_id};
use toolloop::message::Message;
use toolloop::outcome::Outcome;
use toolloop_store::{Durability, RunTags, Store, StoreError};

impl DurabilityArg {
    /// The store's durability; `None` for `none`.
    pub(crate) fn store(self) -> Option<Durability> {
        match self {
            DurabilityArg::Process => Some(Durability::Process),
            DurabilityArg::Power => Some(Durability::PowerCut),
            DurabilityArg::None => None,
        }
    }
}

/// Opens the store the flags name (one per location per process).
pub(crate) async fn open_store(cx: &Cx, args: &StoreArgs) -> Result<Store, CliError> {
    open_store_with(cx, args, Durability::default()).await
}

/// The stores the command opened, by location and durability (one of each per process; kept
/// in [`Cx`]).
#[derive(Default)]
pub(crate) struct Stores(Mutex<HashMap<(String, Durability), Store>>);

/// Opens the store the flags name with the durability given (one per location and durability
/// per process).
pub(crate) async fn open_store_with(
    cx: &Cx,
    args: &StoreArgs,
    durability: Durability,
) -> Result<Store, CliError> {
    let location = match &args.store {
        Some(s) if !s.trim().is_empty() => s.trim().to_string(),
        _ => match Store::default_location() {
            Some(p) => p.to_string_lossy().into_owned(),
            None => {
                return Err(CliError::usage(
                    "no store: set --store <path|postgres://…> (or TOOLLOOP_STORE), or HOME / \
                     XDG_DATA_HOME for the default location",
                ));
            }
        },
    };
    let key = (location, durability);
    if let Some(s) = cx.stores.0.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(s);
    }
    match Store::open_with(&key.0, durability).await {
        Ok(store) => {
            if let Ok(mut m) = cx.stores.0.lock() {
                m.insert(key, store.clone());
            }
            Ok(store)
        }
        Err(source) => Err(CliError::Store {
            context: format!("{source}; choose another with --store <path|postgres://…>"),
            source,
        }),
    }
}

/// Closes every store the command opened (see [`Store::close`]): their writes are finished and
/// a SQLite file's log is copied into it and removed once it is past 1 MiB, else left for the
/// next command to read and write on (which saves the disk syncs of copying it at every end).
pub(crate) async fn close_stores(cx: &Cx) {
    let stores: Vec<Store> = cx
        .stores
        .0
        .lock()
        .map(|mut m| std::mem::take(&mut *m).into_values().collect())
        .unwrap_or_default();
    for store in stores {
        store.close().await;
    }
}

/// A run's link to the store. With a session, the session is held (see
/// [`Store::lock_session`]) from [`Durable::open`] to the end of [`Durable::run`] (or
/// [`Durable::close`]): runs of one session go one at a time, and a second one is refused with
/// the holder's name.
pub(crate) struct Durable {
    /// `None` with --no-store.
    store: Option<Store>,
    session: Option<String>,
    resume: Option<String>,
    /// The failed run a new run goes on from (see [`DurableArgs::retry`]).
    retry: Option<String>,
    meta: Value,
    /// This process's name in the session's lease, while it holds the session.
    holder: Option<String>,
    /// The session's transcript and revision, read under the lease (new runs only).
    history: Vec<Message>,
    revision: Option<i64>,
}

impl Durable {
    /// Opens the store for a run, and takes the run's session. `args` is the run's whole
    /// configuration, kept with the run so `toolloop resume` can rebuild the same agent.
    pub(crate) async fn open<T: Serialize>(
        cx: &Cx,
        durable: &DurableArgs,
        args: &T,
    ) -> Result<Self, CliError> {
        let durability = match durable.durability.store() {
            Some(d) if !durable.no_store => d,
            _ => {
                if durable.session.is_some() || durable.resume.is_some() || durable.retry.is_some()
                {
                    return Err(CliError::usage(
                        "--durability none (--no-store) writes nothing, so it cannot go with \
                         --session or resume; use --durability process or power",
                    ));
                }
                return Ok(Durable {
                    store: None,
                    session: None,
                    resume: None,
                    retry: None,
                    meta: Value::Null,
                    holder: None,
                    history: Vec::new(),
                    revision: None,
                });
            }
        };
        let store = open_store_with(cx, &durable.store, durability).await?;
        let mut this = Durable {
            store: Some(store.clone()),
            session: durable.session.clone(),
            resume: durable.resume.clone(),
            retry: durable.retry.clone(),
            meta: run_meta(args),
            holder: None,
            history: Vec::new(),
            revision: None,
        };
        let Some(name) = this.session.clone() else {
            return Ok(this);
        };
        let lease = format!("lease {}", &new_run_id()[4..]);
        let holder = match &this.resume {
            Some(id) => format!("pid {} resuming {id} ({lease})", std::process::id()),
            None => format!("pid {} ({lease})", std::process::id()),
        };
        if let Err(e) = store.lock_session(&name, &holder).await {
            return Err(match (&e, &this.resume) {
                // Two resumes of one run: the run is what is taken.
                (StoreError::SessionBusy { holder: other, .. }, Some(id))
                    if other.contains(&format!("resuming {id} ")) =>
                {
                    CliError::journal(JournalError::Locked {
                        run_id: id.clone(),
                        holder: other.clone(),
                    })
                }
                _ => CliError::store(e),
            });
        }
        this.holder = Some(holder);
        if this.resume.is_none() {
            match store.session(&name).await {
                Ok(Some(s)) => {
                    for r in &s.repairs {
                        crate::error::warn(format!("session {name}: repaired: {r}"));
                    }
                    this.history = s.messages;
                    this.revision = Some(s.summary.revision);
                }
                Ok(None) => this.revision = Some(0),
                Err(e) => {
                    this.close().await;
                    return Err(CliError::store(e));
                }
            }
        }
        Ok(this)
    }

    /// Gives the session back (done by [`Durable::run`]; for a run that does not start).
    pub(crate) async fn close(&mut self) {
        if let (Some(store), Some(name), Some(holder)) =
            (&self.store, &self.session, self.holder.take())
            && let Err(e) = store.unlock_session(name, &holder).await
        {
            crate::error::warn(format!("cannot give back session {name}: {e}"));
        }
    }

    /// The journal the agent logs to; `None` with --no-store.
    pub(crate) fn journal(&self) -> Option<Arc<dyn Journal>> {
        Some(self.store.as_ref()?.run_journal(RunTags {
            session: self.session.clone(),
            session_revision: self.revision,
            meta: Some(self.meta.clone()),
            on_started: None,
        }))
    }

    /// Runs the prompt (after the session's history), or resumes the run `toolloop resume`
    /// named; saves the outcome and the session's transcript; gives the session back.
    pub(crate) async fn run(
        &mut self,
        agent: &Agent,
        prompt: Message,
        cancel: CancellationToken,
    ) -> Result<Outcome, CliError> {
        let result = self.run_held(agent, prompt, cancel).await;
        self.close().await;
        result
    }

    async fn run_held(
        &mut self,
        agent: &Agent,
        prompt: Message,
        cancel: CancellationToken,
    ) -> Result<Outcome, CliError> {
        let outcome = match (&self.resume, &self.store) {
            (Some(run_id), Some(store)) => {
                // Continuing a run whose session has moved on would drop the later turns.
                if let Err(source) = store.check_resume(run_id).await {
                    return Err(CliError::Store {
                        context: "cannot resume".into(),
                        source,
                    });
                }
                agent
                    .resume(run_id, cancel)
                    .await
                    .map_err(CliError::journal)?
            }
            (None, Some(_)) if self.retry.is_some() => {
                let failed = self.retry.clone().unwrap_or_default();
                let conversation = self.conversation_of(agent, &failed).await?;
                let outcome = agent.run_cancellable(conversation, cancel).await;
                if let Some(id) = &outcome.run_id {
                    crate::error::warn(format!("run {failed} was continued as run {id}"));
                }
                outcome
            }
            _ => {
                let mut messages = std::mem::take(&mut self.history);
                messages.push(prompt);
                agent.run_cancellable(messages, cancel).await
            }
        };
        // A run that waits for approvals is not over: only that it waits is saved (its outcome
        // is saved when it ends).
        if let (Some(run_id), Some(store)) = (&outcome.run_id, &self.store)
            && let Err(e) = store.save_outcome(run_id, &outcome).await
        {
            if matches!(e, StoreError::SessionMoved { .. }) {
                return Err(CliError::Store {
                    context: "the run finished, but saving it failed".into(),
                    source: e,
                });
            }
            crate::error::warn(format!("the run finished, but saving it failed: {e}"));
        }
        Ok(outcome)
    }
}

impl Durable {
    /// The conversation of the failed run `failed` as its log holds it (its context view, with
    /// a context policy), for a new run to go on from. Refused when the session has had other
    /// turns saved since (going on would drop them).
    async fn conversation_of(&self, agent: &Agent, failed: &str) -> Result<Vec<Message>, CliError> {
        // The run was found before: a log that fails now is a failure (exit code 1), not a
        // wrong argument, whatever it says.
        let outcome = agent
            .logged_outcome(failed)
            .await
            .map_err(|e| CliError::failed(e.to_string()))?;
        let conversation = match outcome.context {
            Some(_) => outcome.view().to_vec(),
            None => outcome.messages,
        };
        // The session holds the failed run's turn (it saved it), or what came before it.
        if let Some(name) = &self.session
            && !conversation.starts_with(&self.history)
        {
            return Err(CliError::failed(format!(
                "cannot continue run {failed}: session {name} has had other turns saved since it \
                 failed, which going on from it would drop; continue the conversation in a new \
                 run: toolloop run --session {name} \"…\""
            )));
        }
        Ok(conversation)
    }
}

/// The key of a run's configuration that lists the fields whose credentials were removed.
pub(crate) const CREDENTIALS_REMOVED: &str = "credentials_removed";

/// The configuration kept with a run: everything but the prompt, the output format and the
/// store flags; the file tools' root made absolute. No secret is kept: a URL's user name,
/// password, query and fragment (`https://user:pass@host/v1?key=…`) are removed, and the
/// fields they were removed from listed under [`CREDENTIALS_REMOVED`], so that `toolloop
/// resume` asks for them again.
pub(crate) fn run_meta<T: Serialize>(args: &T) -> Value {
    let mut meta = serde_json::to_value(args).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut meta {
        for k in ["prompt", "attach", "json", "jsonl", "durable"] {
            m.remove(k);
        }
        let mut removed = Vec::new();
        for (k, v) in m.iter_mut() {
            if strip_credentials(v) {
                removed.push(Value::String(k.clone()));
            }
        }
        if !removed.is_empty() {
            m.insert(CREDENTIALS_REMOVED.into(), Value::Array(removed));
        }
        if let Some(root) = m.get("root").and_then(Value::as_str)
            && let Ok(abs) = std::path::Path::new(root).canonicalize()
        {
            m.insert("root".into(), Value::String(abs.to_string_lossy().into()));
        }
    }
    meta
}

/// Removes what may be a credential from every URL in `v` (a user name, a password, a query,
/// a fragment); whether anything was removed. A string with `://` that does not parse as a URL
/// is dropped whole.
fn strip_credentials(v: &mut Value) -> bool {
    match v {
        Value::String(s) if s.contains("://") => {
            let Ok(mut url) = url::Url::parse(s) else {
                *v = Value::Null;
                return true;
            };
            let secret = !url.username().is_empty()
                || url.password().is_some()
                || url.query().is_some()
                || url.fragment().is_some();
            if secret {
                let _ = url.set_username("");
                let _ = url.set_password(None);
                url.set_query(None);
                url.set_fragment(None);
                *v = Value::String(url.to_string());
            }
            secret
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |any, i| strip_credentials(i) | any),
        Value::Object(m) => m
            .values_mut()
            .fold(false, |any, i| strip_credentials(i) | any),
        _ => false,
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub(crate) fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_removed_from_urls() {
        let mut v = serde_json::json!({
            "base_url": "http://me:hunter2@127.0.0.1:8080/v1?key=sekrit#frag",
            "plain": "http://127.0.0.1:8080/v1",
            "nested": {"list": ["https://tok@host/x"]},
            "text": "not a url",
        });
        assert!(strip_credentials(&mut v));
        let text = v.to_string();
        assert!(!text.contains("hunter2") && !text.contains("sekrit") && !text.contains("tok@"));
        assert_eq!(v["base_url"], "http://127.0.0.1:8080/v1");
        assert_eq!(v["plain"], "http://127.0.0.1:8080/v1");
        assert_eq!(v["nested"]["list"][0], "https://host/x");
        let mut plain = serde_json::json!({"base_url": "http://127.0.0.1/v1", "n": 3});
        assert!(!strip_credentials(&mut plain));
    }

    #[test]
    fn dates() {
        assert_eq!(format_ms(0), "1970-01-01 00:00:00");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(format_ms(1_700_000_000_000), "2023-11-14 22:13:20");
    }
}
