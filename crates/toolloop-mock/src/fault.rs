//! Fault injection: which responses fail, and how, decided from the scenario's seed.
//!
//! A request's *key* is a hash of its route, its model name and its body, with the mock's call
//! ids masked (they differ from one server run to the next). The server counts the attempts made
//! with each key; attempt `n` of key `k` is a fault when `mix(seed, k, n)`, read as a number in
//! `[0, 1)`, is below the scenario's share. A retried request therefore draws anew (and can
//! succeed), and a run that sends the same requests gets the same faults.
//!
//! See the [module docs](super) for the grammar.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::scenario::Scenario;

/// One kind of injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FaultKind {
    /// HTTP 429 with `Retry-After` (whole seconds, rounded up) and `retry-after-ms`.
    RateLimited,
    /// HTTP 500.
    ServerError,
    /// HTTP 503.
    Unavailable,
    /// HTTP 529 (Anthropic's "overloaded"); drawn for the Anthropic API only.
    Overloaded,
    /// The connection is reset before any byte of the response.
    Reset,
    /// The response starts (status 200 and part of the body), then the connection is reset.
    ResetBody,
    /// The body ends cleanly in the middle of the first tool call's arguments (in the middle of
    /// the text when the reply has no call): a stream stops after half the arguments, a JSON
    /// body is cut there.
    CutCall,
    /// A 200 whose body is not valid JSON (a stream gets a first event that is not JSON).
    MalformedJson,
    /// The response head comes late, after the scenario's `slow_delay`.
    Slow,
}

impl FaultKind {
    /// Every kind, in the order of [`FaultKind::index`].
    pub const ALL: [FaultKind; 9] = [
        FaultKind::RateLimited,
        FaultKind::ServerError,
        FaultKind::Unavailable,
        FaultKind::Overloaded,
        FaultKind::Reset,
        FaultKind::ResetBody,
        FaultKind::CutCall,
        FaultKind::MalformedJson,
        FaultKind::Slow,
    ];

    /// The kind's name in `fault_kinds=`: `429`, `500`, `503`, `529`, `reset`, `reset_body`,
    /// `cut_call`, `malformed_json`, `slow`.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::RateLimited => "429",
            FaultKind::ServerError => "500",
            FaultKind::Unavailable => "503",
            FaultKind::Overloaded => "529",
            FaultKind::Reset => "reset",
            FaultKind::ResetBody => "reset_body",
            FaultKind::CutCall => "cut_call",
            FaultKind::MalformedJson => "malformed_json",
            FaultKind::Slow => "slow",
        }
    }

    /// The kind with this `fault_kinds=` name.
    pub fn from_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Position in [`FaultKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The HTTP status of an error fault.
    pub fn status(self) -> Option<u16> {
        match self {
            FaultKind::RateLimited => Some(429),
            FaultKind::ServerError => Some(500),
            FaultKind::Unavailable => Some(503),
            FaultKind::Overloaded => Some(529),
            _ => None,
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of fault kinds (`fault_kinds=429+500+reset_body`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FaultKinds(u16);

impl FaultKinds {
    /// Every kind.
    pub const ALL: FaultKinds = FaultKinds((1 << FaultKind::ALL.len()) - 1);
    /// No kind.
    pub const NONE: FaultKinds = FaultKinds(0);

    /// The set with `kind` added.
    pub fn with(self, kind: FaultKind) -> FaultKinds {
        FaultKinds(self.0 | 1 << kind.index())
    }

    /// Whether `kind` is in the set.
    pub fn contains(self, kind: FaultKind) -> bool {
        self.0 & (1 << kind.index()) != 0
    }

    /// The kinds in the set, in [`FaultKind::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = FaultKind> {
        FaultKind::ALL
            .into_iter()
            .filter(move |k| self.contains(*k))
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl Default for FaultKinds {
    fn default() -> Self {
        FaultKinds::ALL
    }
}

impl FromIterator<FaultKind> for FaultKinds {
    fn from_iter<I: IntoIterator<Item = FaultKind>>(iter: I) -> Self {
        iter.into_iter().fold(FaultKinds::NONE, FaultKinds::with)
    }
}

impl fmt::Display for FaultKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == FaultKinds::ALL {
            return f.write_str("all");
        }
        let mut sep = "";
        for kind in self.iter() {
            write!(f, "{sep}{kind}")?;
            sep = "+";
        }
        Ok(())
    }
}

/// Injected faults so far, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts([u64; FaultKind::ALL.len()]);

impl FaultCounts {
    /// Faults of this kind.
    pub fn get(&self, kind: FaultKind) -> u64 {
        self.0[kind.index()]
    }

    /// All faults.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// `(kind, count)` for every kind, in [`FaultKind::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (FaultKind, u64)> + '_ {
        FaultKind::ALL.into_iter().map(|k| (k, self.get(k)))
    }
}

impl fmt::Display for FaultCounts {
    /// `429: 3, 500: 1, …` (kinds with a zero count are left out; `none` when all are).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for (kind, n) in self.iter().filter(|(_, n)| *n > 0) {
            write!(f, "{sep}{kind}: {n}")?;
            sep = ", ";
        }
        if sep.is_empty() {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// The wire protocol a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    OpenAi,
    Anthropic,
    Gemini,
}

/// A fault drawn for one request: its kind, and a random number for where it strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Drawn {
    pub kind: FaultKind,
    pub aux: u64,
}

/// Above this many distinct request keys, the attempt counters start over (memory bound for a
/// long-running server; reproducibility holds for runs below it).
const MAX_KEYS: usize = 1 << 20;

/// The server's fault state: attempt counters and counts by kind.
#[derive(Default)]
pub(crate) struct FaultState {
    attempts: Mutex<HashMap<u64, u32>>,
    counts: [AtomicU64; FaultKind::ALL.len()],
}

impl FaultState {
    /// Decides whether this request fails, and how. Counts nothing: [`FaultState::count`] does,
    /// once the response is sent.
    pub(crate) fn draw(
        &self,
        scenario: &Scenario,
        protocol: Protocol,
        route: &str,
        body: &[u8],
    ) -> Option<Drawn> {
        if scenario.faults == 0 {
            return None;
        }
        let kinds: Vec<FaultKind> = scenario
            .fault_kinds
            .iter()
            .filter(|k| *k != FaultKind::Overloaded || protocol == Protocol::Anthropic)
            .collect();
        if kinds.is_empty() {
            return None;
        }
        let key = request_key(route, body);
        let attempt = {
            let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
            if attempts.len() >= MAX_KEYS && !attempts.contains_key(&key) {
                attempts.clear();
            }
            let n = attempts.entry(key).or_insert(0);
            let attempt = *n;
            *n = n.saturating_add(1);
            attempt
        };
        decide(scenario, key, attempt, &kinds)
    }

    /// Counts one fault that was sent.
    pub(crate) fn count(&self, kind: FaultKind) {
        self.counts[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn counts(&self) -> FaultCounts {
        let mut out = FaultCounts::default();
        for (slot, count) in out.0.iter_mut().zip(&self.counts) {
            *slot = count.load(Ordering::Relaxed);
        }
        out
    }
}

/// The draw for attempt `attempt` of the request with key `key`.
fn decide(scenario: &Scenario, key: u64, attempt: u32, kinds: &[FaultKind]) -> Option<Drawn> {
    let h = mix(scenario.seed ^ mix(key ^ mix(u64::from(attempt).wrapping_add(0x5eed))));
    // 53 bits as a number in [0, 1), against the share in parts per million.
    let unit = (h >> 11) as f64 / (1u64 << 53) as f64;
    if unit * 1e6 >= f64::from(scenario.faults) {
        return None;
    }
    let pick = mix(h ^ 0x6b69_6e64);
    let kind = kinds[(pick % kinds.len() as u64) as usize];
    Some(Drawn {
        kind,
        aux: mix(pick),
    })
}

/// SplitMix64's finaliser: a well-spread 64-bit hash of a 64-bit value.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Prefixes of the ids the mock gives its calls; the hex counter after them is masked out of a
/// request's key.
pub(crate) const ID_PREFIXES: [&[u8]; 2] = [b"call_mock", b"toolu_mock"];

/// FNV-1a of the route and the body, with the counters of the mock's call ids skipped.
pub(crate) fn request_key(route: &str, body: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut put = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    };
    for &b in route.as_bytes() {
        put(b);
    }
    put(0xff);
    let mut i = 0;
    while i < body.len() {
        let rest = &body[i..];
        if let Some(prefix) = ID_PREFIXES.iter().find(|p| rest.starts_with(p)) {
            prefix.iter().for_each(|&b| put(b));
            i += prefix.len();
            while body.get(i).is_some_and(u8::is_ascii_hexdigit) {
                i += 1;
            }
        } else {
            put(body[i]);
            i += 1;
        }
    }
    h
}

/// Where to cut a body for [`FaultKind::CutCall`]: in the middle of the first occurrence of
/// `needle` (the first call's arguments, or the text, as they appear in the body) after `after`
/// (the call's name), else in the middle of the body. Never 0, never the whole body.
pub(crate) fn cut_point(body: &[u8], after: &[u8], needle: &[u8]) -> usize {
    let find = |hay: &[u8], what: &[u8]| {
        (!what.is_empty())
            .then(|| hay.windows(what.len()).position(|w| w == what))
            .flatten()
    };
    let start = find(body, after).map_or(0, |p| p + after.len());
    let at = match find(&body[start..], needle) {
        Some(p) => start + p + (needle.len() / 2).max(1),
        None => body.len() / 2,
    };
    at.clamp(1, body.len().saturating_sub(1).max(1))
}

/// Where to reset a body of `len` bytes: somewhere strictly inside it.
pub(crate) fn reset_point(len: usize, aux: u64) -> usize {
    if len < 2 {
        return len.min(1);
    }
    1 + (aux % (len as u64 - 1)) as usize
}

/// The bytes a [`FaultKind::MalformedJson`] body starts with, in place of the body's first `{`.
pub(crate) const MALFORMED_OBJECT: &[u8] = br#"{"mock_fault":malformed,"#;

/// The body with a syntax error near its start: `{"mock_fault":malformed,…`.
pub(crate) fn malform(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + MALFORMED_OBJECT.len());
    match body.first() {
        Some(b'{') => {
            out.extend_from_slice(MALFORMED_OBJECT);
            out.extend_from_slice(&body[1..]);
        }
        Some(b'[') => {
            out.extend_from_slice(b"[malformed,");
            out.extend_from_slice(&body[1..]);
        }
        _ => {
            out.extend_from_slice(MALFORMED_OBJECT);
            out.extend_from_slice(body);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(model: &str) -> Scenario {
        Scenario::from_model(model).unwrap()
    }

    #[test]
    fn keys_ignore_the_mock_id_counters_only() {
        let a = br#"{"id":"call_mock00000000deadbeef","x":1}"#;
        let b = br#"{"id":"call_mock0000000012345678","x":1}"#;
        let c = br#"{"id":"call_mock0000000012345678","x":2}"#;
        assert_eq!(request_key("r", a), request_key("r", b));
        assert_ne!(request_key("r", b), request_key("r", c));
        assert_ne!(request_key("r", a), request_key("s", a));
        let t1 = br#"{"id":"toolu_mock00000000000000aa"}"#;
        let t2 = br#"{"id":"toolu_mock00000000000000bb"}"#;
        assert_eq!(request_key("r", t1), request_key("r", t2));
    }

    #[test]
    fn the_share_is_respected_and_retries_draw_anew() {
        let s = scenario("mock:faults=0.2,seed=7");
        let kinds: Vec<FaultKind> = FaultKind::ALL.to_vec();
        let n = 20_000u32;
        let faults = (0..n)
            .filter(|&k| decide(&s, mix(u64::from(k)), 0, &kinds).is_some())
            .count();
        let share = faults as f64 / f64::from(n);
        assert!((0.18..0.22).contains(&share), "{share}");
        // Each attempt is an independent draw: some keys fail first and then succeed.
        let recovered = (0..1000u64)
            .filter(|&k| decide(&s, k, 0, &kinds).is_some() && decide(&s, k, 1, &kinds).is_none())
            .count();
        assert!(recovered > 100, "{recovered}");
        // Every kind comes up.
        let mut seen = FaultKinds::NONE;
        for k in 0..2000u64 {
            if let Some(d) = decide(&s, k, 0, &kinds) {
                seen = seen.with(d.kind);
            }
        }
        assert_eq!(seen, FaultKinds::ALL);
        assert!(decide(&scenario("mock:faults=0"), 1, 0, &kinds).is_none());
        assert!(
            (0..100).all(|k| decide(&scenario("mock:faults=1"), k, 0, &kinds).is_some()),
            "faults=1 fails every response"
        );
    }

    #[test]
    fn same_seed_same_draws_other_seed_other_draws() {
        let kinds: Vec<FaultKind> = FaultKind::ALL.to_vec();
        let draws = |model: &str| -> Vec<Option<Drawn>> {
            let s = scenario(model);
            (0..200u64).map(|k| decide(&s, k, 0, &kinds)).collect()
        };
        assert_eq!(
            draws("mock:faults=0.3,seed=1"),
            draws("mock:faults=0.3,seed=1")
        );
        assert_ne!(
            draws("mock:faults=0.3,seed=1"),
            draws("mock:faults=0.3,seed=2")
        );
    }

    #[test]
    fn state_counts_attempts_per_key_and_skips_529_off_anthropic() {
        let state = FaultState::default();
        let s = scenario("mock:faults=1,fault_kinds=529");
        assert!(state.draw(&s, Protocol::OpenAi, "r", b"{}").is_none());
        assert!(state.draw(&s, Protocol::Gemini, "r", b"{}").is_none());
        let d = state.draw(&s, Protocol::Anthropic, "r", b"{}").unwrap();
        assert_eq!(d.kind, FaultKind::Overloaded);
        let s = scenario("mock:faults=0.5,seed=3");
        let first: Vec<_> = (0..50)
            .map(|_| state.draw(&s, Protocol::OpenAi, "same", b"{}"))
            .collect();
        let fresh = FaultState::default();
        let again: Vec<_> = (0..50)
            .map(|_| fresh.draw(&s, Protocol::OpenAi, "same", b"{}"))
            .collect();
        assert_eq!(
            first, again,
            "attempt n of a key draws the same on any server"
        );
        assert!(first.iter().any(Option::is_some) && first.iter().any(Option::is_none));
    }

    #[test]
    fn cut_and_reset_points_fall_inside() {
        let body = br#"{"name":"read","arguments":"{\"path\":\"a\"}"}"#;
        let at = cut_point(body, br#""read""#, br#""{\"path\":\"a\"}""#);
        let args = body.windows(5).position(|w| w == b"\"{\\\"p").unwrap();
        assert!(at > args && at < body.len() - 2, "{at}");
        assert_eq!(cut_point(b"abcd", b"x", b"zz"), 2);
        assert_eq!(cut_point(b"a", b"", b""), 1);
        for aux in 0..100 {
            let p = reset_point(10, aux);
            assert!((1..10).contains(&p));
        }
        assert!(serde_json::from_slice::<serde_json::Value>(&malform(b"{\"a\":1}")).is_err());
        assert!(serde_json::from_slice::<serde_json::Value>(&malform(b"[1]")).is_err());
    }

    #[test]
    fn kinds_have_names_and_render() {
        for kind in FaultKind::ALL {
            assert_eq!(FaultKind::from_name(kind.name()), Some(kind));
        }
        let set: FaultKinds = [FaultKind::RateLimited, FaultKind::ResetBody]
            .into_iter()
            .collect();
        assert_eq!(set.to_string(), "429+reset_body");
        assert_eq!(FaultKinds::ALL.to_string(), "all");
        let mut counts = FaultCounts::default();
        assert_eq!(counts.to_string(), "none");
        counts.0[FaultKind::Slow.index()] = 2;
        assert_eq!(counts.to_string(), "slow: 2");
        assert_eq!(counts.total(), 2);
    }
}
