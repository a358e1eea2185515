//! JSON objects read in place: each object's known fields are written straight into the
//! structure the caller holds (a choice into a reply's `choices`, a call into a message's
//! `tool_calls`), rather than built bottom-up and moved through every layer of serde's return
//! values. Shared by the complete reply (`response`) and the stream's chunks (`stream`).
//!
//! An object accepts exactly what a derived `Deserialize` of the same fields behind
//! [`Obj`](super::response::typed::Obj) would: a JSON object only, unknown fields ignored, a
//! known field twice an error, a required field ([`Fields::missing`]) missing an error. An
//! unknown field's value is skipped unread ([`IgnoredAny`]), as a derived `Deserialize` skips
//! it: what only reading it would refuse (a lone surrogate in a string, a number out of range,
//! nesting past serde_json's limit of 128) does not stop a reply whose known fields are sound,
//! although the value path, which reads the whole body, refuses such a body. Every chunk of a
//! stream repeats fields the decoder does not read (`id`, `object`, `model`), so scanning them
//! rather than reading them is the cheaper path of the two.

use super::response::typed::{Few, opt_str};
use serde::de::{
    self, DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use std::borrow::Cow;
use std::fmt;

/// A JSON object read in place: its known fields by position in `NAMES`.
pub(super) trait Fields<'de> {
    /// The known fields (at most 32).
    const NAMES: &'static [&'static str];
    /// Reads field `NAMES[which]`'s value from `map`.
    fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error>;
    /// The first required field missing once the object was read (`seen` has bit `i` set for
    /// each field `NAMES[i]` read), if any.
    fn missing(_seen: u32) -> Option<&'static str> {
        None
    }
}

/// A string or `null`, borrowed when it holds no escape (see `opt_str`).
pub(super) struct Str;

impl<'de> DeserializeSeed<'de> for Str {
    type Value = Option<Cow<'de, str>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        opt_str(d)
    }
}

/// A field name: its position among the known ones, `None` for another.
struct Key(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|n| *n == v))
    }
}

/// Reads a JSON object into `T` in place.
pub(super) struct InPlace<'p, T>(pub(super) &'p mut T);

impl<'de, T: Fields<'de>> DeserializeSeed<'de> for InPlace<'_, T> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: Fields<'de>> Visitor<'de> for InPlace<'_, T> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = 0u32;
        while let Some(key) = map.next_key_seed(Key(T::NAMES))? {
            match key {
                Some(which) => {
                    if seen & (1 << which) != 0 {
                        return Err(A::Error::duplicate_field(T::NAMES[which]));
                    }
                    seen |= 1 << which;
                    self.0.field(which, &mut map)?;
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        match T::missing(seen) {
            Some(field) => Err(A::Error::missing_field(field)),
            None => Ok(()),
        }
    }
}

/// Reads a JSON object or `null` (left `None`) into an `Option<T>` in place.
pub(super) struct Object<'p, T>(pub(super) &'p mut Option<T>);

impl<'de, T: Fields<'de> + Default> DeserializeSeed<'de> for Object<'_, T> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, T: Fields<'de> + Default> Visitor<'de> for Object<'_, T> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object or null")
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        InPlace(self.0.insert(T::default())).deserialize(d)
    }
}

/// Reads a JSON array of objects or `null` (left empty) into a [`Few`] in place.
pub(super) struct Array<'p, T>(pub(super) &'p mut Few<T>);

impl<'de, T: Fields<'de> + Default> DeserializeSeed<'de> for Array<'_, T> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, T: Fields<'de> + Default> Visitor<'de> for Array<'_, T> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array or null")
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let few = self.0;
        if seq
            .next_element_seed(InPlace(few.first.insert(T::default())))?
            .is_none()
        {
            few.first = None;
            return Ok(());
        }
        let mut next = T::default();
        while seq.next_element_seed(InPlace(&mut next))?.is_some() {
            few.rest.push(std::mem::take(&mut next));
        }
        Ok(())
    }
}

/// Reads a JSON array of objects (not `null`) into a [`Few`] in place.
pub(super) struct Seq<'p, T>(pub(super) &'p mut Few<T>);

impl<'de, T: Fields<'de> + Default> DeserializeSeed<'de> for Seq<'_, T> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(Array(self.0))
    }
}

/// Reads `T`'s fields from the JSON object in `data` into `out` (a default one); `Err` when
/// `data` is not such an object, then `out` is to be dropped.
pub(super) fn parse<'a, T: Fields<'a>>(data: &'a str, out: &mut T) -> serde_json::Result<()> {
    let mut de = serde_json::Deserializer::from_str(data);
    InPlace(out).deserialize(&mut de)?;
    de.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{"s": string or null, "xs": array or null of {"n": count}, "req": required array}`.
    #[derive(Default)]
    struct T<'a> {
        s: Option<Cow<'a, str>>,
        xs: Few<Item>,
        req: Few<Item>,
    }

    #[derive(Default, Debug, PartialEq)]
    struct Item {
        n: Option<u64>,
    }

    impl<'de> Fields<'de> for T<'de> {
        const NAMES: &'static [&'static str] = &["s", "xs", "req"];
        fn field<A: MapAccess<'de>>(&mut self, which: usize, map: &mut A) -> Result<(), A::Error> {
            match which {
                0 => self.s = map.next_value_seed(Str)?,
                1 => map.next_value_seed(Array(&mut self.xs))?,
                _ => map.next_value_seed(Seq(&mut self.req))?,
            }
            Ok(())
        }
        fn missing(seen: u32) -> Option<&'static str> {
            (seen & 0b100 == 0).then_some("req")
        }
    }

    impl<'de> Fields<'de> for Item {
        const NAMES: &'static [&'static str] = &["n"];
        fn field<A: MapAccess<'de>>(&mut self, _: usize, map: &mut A) -> Result<(), A::Error> {
            self.n = map.next_value()?;
            Ok(())
        }
    }

    fn read(text: &str) -> Option<T<'_>> {
        let mut t = T::default();
        parse(text, &mut t).ok().map(|()| t)
    }

    fn items(few: Few<Item>) -> Vec<Option<u64>> {
        few.into_iter().map(|i| i.n).collect()
    }

    /// Strings borrow from the text unless they hold an escape; an array read as a [`Few`] keeps
    /// every element, in order, whatever its length; unknown fields of any shape are skipped.
    #[test]
    fn strings_borrow_unless_escaped_and_arrays_keep_every_element() {
        let t = read(r#"{"s":"plain","xs":[{"n":1},{"n":2},{"x":[{}],"n":3}],"req":[]}"#).unwrap();
        assert!(matches!(t.s, Some(Cow::Borrowed("plain"))));
        assert_eq!(items(t.xs), [Some(1), Some(2), Some(3)]);
        assert!(items(t.req).is_empty());
        let t = read(r#"{"req":[{}],"s":"a\"b é","\u0078s":[{"n":7}]}"#).unwrap();
        assert!(matches!(&t.s, Some(Cow::Owned(s)) if s == "a\"b é"));
        assert_eq!(items(t.xs), [Some(7)]);
        assert_eq!(items(t.req), [None]);
        let t = read(r#"{"s":null,"xs":null,"req":[],"other":{"a":[1,"b",null]}}"#).unwrap();
        assert!(t.s.is_none() && t.xs.first.is_none());
        for odd in [
            r#"{"s":1,"req":[]}"#,
            r#"{"s":[],"req":[]}"#,
            r#"{"xs":{},"req":[]}"#,
            r#"{"xs":[{"n":1},[]],"req":[]}"#,
            r#"{"xs":[{"n":-1}],"req":[]}"#,
            // A required array: present, and not `null`.
            r#"{}"#,
            r#"{"req":null}"#,
            // A field twice.
            r#"{"req":[],"req":[]}"#,
            r#"{"s":"a","req":[],"s":"b"}"#,
            // Not an object.
            r#"[]"#,
            r#"{"req":[]} x"#,
        ] {
            assert!(read(odd).is_none(), "{odd}");
        }
    }

    /// An unknown field's value is skipped unread, whatever it holds: also what only reading it
    /// as a JSON value refuses (a lone surrogate, a number out of range, nesting past 128),
    /// while a malformed value still stops the object.
    #[test]
    fn unknown_fields_are_skipped_unread() {
        let deep = format!(r#"{{"req":[],"x":{}{}}}"#, "[".repeat(200), "]".repeat(200));
        for text in [
            r#"{"req":[],"x":"\ud800"}"#.to_string(),
            r#"{"req":[],"x":"\udc00\ud800"}"#.to_string(),
            r#"{"req":[],"x":{"\ud800":1}}"#.to_string(),
            r#"{"req":[],"x":[1e400]}"#.to_string(),
            r#"{"req":[],"x":[-1.5e300,18446744073709551616,true,null]}"#.to_string(),
            deep,
        ] {
            assert!(read(&text).is_some(), "{text}");
        }
        for malformed in [
            r#"{"req":[],"x":[1,}"#,
            r#"{"req":[],"x":"\x"}"#,
            r#"{"req":[],"x":tru}"#,
            r#"{"req":[],"x":{"a"}}"#,
        ] {
            assert!(read(malformed).is_none(), "{malformed}");
        }
    }
}
