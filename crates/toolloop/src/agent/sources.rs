//! Tool sources: the tools a run offers now, the agent's own and each source's, listed again
//! when a source's version moves (and left alone a while when a source does not answer).

use super::Agent;
use crate::tool::Tool;
use crate::tool_source::ToolSource;
use crate::toolbox::Toolbox;
use std::sync::Arc;
use std::time::Duration;

/// How long a tool source may take to list its tools by default
/// ([`crate::agent::AgentBuilder::tool_source_timeout`]); one that takes longer keeps the tools
/// it listed last, and is asked again once its version moves or twice that time has passed (so
/// that a source that hangs does not hold up every round).
pub(super) const SOURCE_LISTING: Duration = Duration::from_secs(30);

/// The tool sources of an agent and the toolbox they made last.
pub(super) struct Sources {
    sources: Vec<Arc<dyn ToolSource>>,
    listed: tokio::sync::Mutex<Option<Listed>>,
    /// How long a source may take to list its tools.
    listing: Duration,
    /// How long a source that did not answer is left alone, unless its version moves: twice
    /// `listing`.
    silence: Duration,
}

/// A toolbox made of the agent's tools and its sources', and what it was made from.
struct Listed {
    /// Each source's listing, in order.
    sources: Vec<SourceListing>,
    toolbox: Arc<Toolbox>,
}

/// What a source listed last.
#[derive(Clone)]
struct SourceListing {
    /// Its version when it was listed (`None`: its listing failed; it is asked again).
    version: Option<u64>,
    /// For a source that did not answer: when it is asked again (unless its version moves).
    silent_until: Option<tokio::time::Instant>,
    /// Its tools as listed last.
    tools: Vec<Arc<dyn Tool>>,
}

impl SourceListing {
    /// Whether this listing still stands for a source now at `version`.
    fn fresh(&self, version: u64, now: tokio::time::Instant) -> bool {
        self.version == Some(version) && self.silent_until.is_none_or(|t| now < t)
    }
}

impl Agent {
    /// The tools a run offers now: the agent's own, then each tool source's (listed again when
    /// its version moved; see [`crate::tool_source`]). The same toolbox while nothing changed.
    pub async fn tools_now(&self) -> Arc<Toolbox> {
        self.parts.sources.toolbox_now(&self.parts.toolbox).await
    }
}

impl Sources {
    /// Sources of tools, none listed yet, each given `listing` to list its tools.
    pub(super) fn new(sources: Vec<Arc<dyn ToolSource>>, listing: Duration) -> Self {
        Sources {
            sources,
            listed: tokio::sync::Mutex::new(None),
            listing,
            silence: listing.saturating_mul(2),
        }
    }

    /// Whether there are none.
    pub(super) fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The toolbox of `own` tools and then each source's (see [`Agent::tools_now`]): `own`
    /// itself without sources, the last one made while no source's version moved.
    pub(super) async fn toolbox_now(&self, own: &Arc<Toolbox>) -> Arc<Toolbox> {
        let sources = &self.sources;
        if sources.is_empty() {
            return own.clone();
        }
        let mut listed = self.listed.lock().await;
        let versions: Vec<u64> = sources.iter().map(|s| s.version()).collect();
        let now = tokio::time::Instant::now();
        if let Some(l) = listed.as_ref()
            && l.sources
                .iter()
                .zip(&versions)
                .all(|(s, &v)| s.fresh(v, now))
        {
            return l.toolbox.clone();
        }
        let reserved: Vec<&str> = own.names().collect();
        let mut toolbox = Toolbox::new();
        for tool in own.tools() {
            // The agent's own tools passed these checks when it was built.
            let _ = toolbox.add_arc(tool.clone());
        }
        let mut made = Vec::with_capacity(sources.len());
        for (i, (source, version)) in sources.iter().zip(versions).enumerate() {
            // Cloned, not taken: a run cancelled while a source lists keeps the cache whole.
            let previous = listed.as_ref().and_then(|l| l.sources.get(i)).cloned();
            let listing = match previous {
                // Its version has not moved: it keeps the tools it listed (one that did not
                // answer, until it is due to be asked again).
                Some(p) if p.fresh(version, now) => p,
                previous => {
                    let before = previous.map(|p| p.tools).unwrap_or_default();
                    let answer = tokio::time::timeout(self.listing, source.tools(&reserved)).await;
                    match answer {
                        Ok(Ok(tools)) => SourceListing {
                            version: Some(version),
                            silent_until: None,
                            tools,
                        },
                        Ok(Err(e)) => {
                            tracing::warn!(source = source.name(), "tools not listed: {e}");
                            SourceListing {
                                version: None,
                                silent_until: None,
                                tools: before,
                            }
                        }
                        Err(_) => {
                            tracing::warn!(
                                source = source.name(),
                                "tools not listed: no answer within {:?}; asked again in {:?}",
                                self.listing,
                                self.silence
                            );
                            SourceListing {
                                version: Some(version),
                                silent_until: tokio::time::Instant::now().checked_add(self.silence),
                                tools: before,
                            }
                        }
                    }
                }
            };
            for tool in &listing.tools {
                if let Err(e) = toolbox.add_arc(tool.clone()) {
                    tracing::warn!(source = source.name(), "a tool is left out: {e}");
                }
            }
            made.push(listing);
        }
        let toolbox = Arc::new(toolbox);
        *listed = Some(Listed {
            sources: made,
            toolbox: toolbox.clone(),
        });
        toolbox
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::{ToolContext, ToolError, ToolOutput};
    use crate::tool_source::ToolSourceError;
    use async_trait::async_trait;
    use serde_json::Value;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    struct Named(String, Value);

    #[async_trait]
    impl Tool for Named {
        fn name(&self) -> &str {
            &self.0
        }
        fn description(&self) -> &str {
            "a tool"
        }
        fn parameters(&self) -> &Value {
            &self.1
        }
        async fn call(&self, _: Value, _: ToolContext) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::text("ok"))
        }
    }

    fn tool(name: &str) -> Arc<dyn Tool> {
        Arc::new(Named(name.into(), serde_json::json!({"type": "object"})))
    }

    /// A source whose tools, version and behaviour the test sets.
    #[derive(Default)]
    struct Plugins {
        version: AtomicU64,
        names: std::sync::Mutex<Vec<&'static str>>,
        asked: AtomicUsize,
        fails: AtomicBool,
        hangs: AtomicBool,
    }

    #[async_trait]
    impl ToolSource for Plugins {
        fn name(&self) -> &str {
            "plugins"
        }
        fn version(&self) -> u64 {
            self.version.load(Ordering::SeqCst)
        }
        async fn tools(&self, _: &[&str]) -> Result<Vec<Arc<dyn Tool>>, ToolSourceError> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            if self.hangs.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if self.fails.load(Ordering::SeqCst) {
                return Err(ToolSourceError {
                    source_name: "plugins".into(),
                    message: "down".into(),
                });
            }
            Ok(self.names.lock().unwrap().iter().map(|n| tool(n)).collect())
        }
    }

    fn own(names: &[&str]) -> Arc<Toolbox> {
        let mut toolbox = Toolbox::new();
        for n in names {
            toolbox.add_arc(tool(n)).unwrap();
        }
        Arc::new(toolbox)
    }

    fn names(toolbox: &Arc<Toolbox>) -> Vec<&str> {
        toolbox.names().collect()
    }

    #[tokio::test]
    async fn a_source_is_listed_again_only_when_its_version_moves() {
        let plugins = Arc::new(Plugins::default());
        *plugins.names.lock().unwrap() = vec!["b"];
        let sources = Sources::new(vec![plugins.clone()], SOURCE_LISTING);
        let own = own(&["a"]);
        let first = sources.toolbox_now(&own).await;
        assert_eq!(names(&first), ["a", "b"]);
        let again = sources.toolbox_now(&own).await;
        assert!(
            Arc::ptr_eq(&first, &again),
            "the same toolbox while nothing moved"
        );
        assert_eq!(plugins.asked.load(Ordering::SeqCst), 1);

        *plugins.names.lock().unwrap() = vec!["b", "c"];
        plugins.version.store(1, Ordering::SeqCst);
        let moved = sources.toolbox_now(&own).await;
        assert_eq!(names(&moved), ["a", "b", "c"]);
        assert_eq!(plugins.asked.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_listing_keeps_the_last_tools_and_is_asked_again() {
        let plugins = Arc::new(Plugins::default());
        *plugins.names.lock().unwrap() = vec!["b"];
        let sources = Sources::new(vec![plugins.clone()], SOURCE_LISTING);
        let own = own(&["a"]);
        sources.toolbox_now(&own).await;
        plugins.fails.store(true, Ordering::SeqCst);
        plugins.version.store(1, Ordering::SeqCst);
        assert_eq!(names(&sources.toolbox_now(&own).await), ["a", "b"]);
        // Its version has not moved since, but the failed listing does not stand.
        plugins.fails.store(false, Ordering::SeqCst);
        *plugins.names.lock().unwrap() = vec!["c"];
        assert_eq!(names(&sources.toolbox_now(&own).await), ["a", "c"]);
        assert_eq!(plugins.asked.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_tool_named_like_the_agents_own_is_left_out() {
        let plugins = Arc::new(Plugins::default());
        *plugins.names.lock().unwrap() = vec!["a", "b"];
        let sources = Sources::new(vec![plugins], SOURCE_LISTING);
        let own = own(&["a"]);
        assert_eq!(names(&sources.toolbox_now(&own).await), ["a", "b"]);
    }

    #[tokio::test]
    async fn a_source_that_does_not_answer_is_left_alone_until_it_is_due() {
        // Real time, short: given up after 100 ms, left alone for 200 ms.
        let listing = Duration::from_millis(100);
        let plugins = Arc::new(Plugins::default());
        *plugins.names.lock().unwrap() = vec!["b"];
        let sources = Sources::new(vec![plugins.clone()], listing);
        let own = own(&["a"]);
        sources.toolbox_now(&own).await;
        plugins.hangs.store(true, Ordering::SeqCst);
        plugins.version.store(1, Ordering::SeqCst);
        let before = tokio::time::Instant::now();
        // Given up after `listing`, with the tools it listed last.
        assert_eq!(names(&sources.toolbox_now(&own).await), ["a", "b"]);
        let given_up = tokio::time::Instant::now();
        let waited = given_up - before;
        // Not before, and not after the default's 30 s (a third of it: room for a loaded
        // machine's pauses).
        assert!(
            waited >= listing && waited < SOURCE_LISTING / 3,
            "gave up after {waited:?}"
        );
        // Not asked again while it is silent, at the same version (a cached toolbox takes
        // microseconds; only a machine that paused this task past the 200 ms of silence may
        // ask it again, rightly).
        sources.toolbox_now(&own).await;
        let mut given_up = given_up;
        let asked = plugins.asked.load(Ordering::SeqCst);
        if asked == 3 {
            assert!(tokio::time::Instant::now() >= given_up + sources.silence);
            given_up = tokio::time::Instant::now();
        } else {
            assert_eq!(asked, 2);
        }
        // Asked again once its silence is over: it was set before `given_up`.
        tokio::time::sleep_until(given_up + sources.silence).await;
        plugins.hangs.store(false, Ordering::SeqCst);
        *plugins.names.lock().unwrap() = vec!["c"];
        assert_eq!(names(&sources.toolbox_now(&own).await), ["a", "c"]);
        assert_eq!(plugins.asked.load(Ordering::SeqCst), asked + 1);
    }
}
