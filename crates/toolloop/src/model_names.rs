//! How a model's name finds its row in a table keyed by model names (prices, limits).
//!
//! A lookup tries, in order, the name as given, the name without a `provider:` prefix, and the
//! name without each leading `vendor/` path segment (`openrouter/anthropic/claude-sonnet-4`
//! then `anthropic/claude-sonnet-4` then `claude-sonnet-4`), each exactly and then ignoring
//! ASCII case; failing that, the longest entry that one of them starts with followed by `-` (so
//! a dated `gpt-4o-2099-01-01` finds `gpt-4o`).

use std::collections::HashMap;

/// The names a model is looked up under, most specific first.
fn candidates(model: &str) -> Vec<&str> {
    let mut out = vec![model];
    let bare = model.rsplit_once(':').map_or(model, |(_, m)| m);
    if bare != model {
        out.push(bare);
    }
    let mut rest = bare;
    while let Some((_, tail)) = rest.split_once('/') {
        if !tail.is_empty() {
            out.push(tail);
        }
        rest = tail;
    }
    out
}

/// The row of `model` in `table` (see the [module docs](self) for the order of the tries).
pub(crate) fn lookup<'a, T>(table: &'a HashMap<String, T>, model: &str) -> Option<&'a T> {
    let names = candidates(model);
    for name in &names {
        if let Some(p) = table.get(*name) {
            return Some(p);
        }
    }
    for name in &names {
        if let Some((_, p)) = table.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)) {
            return Some(p);
        }
    }
    for name in &names {
        let found = table
            .iter()
            .filter(|(k, _)| {
                name.len() > k.len()
                    && name.as_bytes()[..k.len()].eq_ignore_ascii_case(k.as_bytes())
                    && name.as_bytes()[k.len()] == b'-'
            })
            .max_by_key(|(k, _)| k.len());
        if let Some((_, p)) = found {
            return Some(p);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fall_back_from_the_most_specific() {
        assert_eq!(
            candidates("openrouter:openrouter/anthropic/claude-sonnet-4"),
            [
                "openrouter:openrouter/anthropic/claude-sonnet-4",
                "openrouter/anthropic/claude-sonnet-4",
                "anthropic/claude-sonnet-4",
                "claude-sonnet-4"
            ]
        );
        let table: HashMap<String, u8> =
            [("gpt-4o".to_string(), 1), ("gpt-4o-mini".to_string(), 2)].into();
        assert_eq!(lookup(&table, "GPT-4O"), Some(&1));
        assert_eq!(lookup(&table, "openai:gpt-4o-mini-2024-07-18"), Some(&2));
        assert_eq!(lookup(&table, "gpt-4oz"), None);
        assert_eq!(lookup(&table, ""), None);
    }
}
