//! Where a key is in the config's text, so an error found after parsing
//! (an unknown reference, a bad value) can name its line and column.
//!
//! The YAML is read to a `Value`, which has no positions. To find one, the
//! text is read again with serde_yaml_ng's deserializer, walking down the
//! key path; at the target the walk fails on purpose, and the deserializer
//! stamps that error with the position it was at. No second YAML parser.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A key's place in the config (or a request body's member: the chat front
/// names its `param` with it): names may contain dots, so it is kept as
/// segments and only written out as `agents.weather.skills[0]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPath(Vec<Segment>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

impl KeyPath {
    /// The path of nested keys `keys`.
    pub fn of(keys: &[&str]) -> Self {
        KeyPath(keys.iter().map(|k| Segment::Key((*k).to_owned())).collect())
    }

    pub fn key(mut self, key: &str) -> Self {
        self.push_key(key);
        self
    }

    pub fn index(mut self, index: usize) -> Self {
        self.push_index(index);
        self
    }

    pub fn push_key(&mut self, key: &str) {
        self.0.push(Segment::Key(key.to_owned()));
    }

    pub fn push_index(&mut self, index: usize) {
        self.0.push(Segment::Index(index));
    }

    pub fn pop(&mut self) {
        self.0.pop();
    }

    /// The path serde_path_to_error tracked to a deserialization error.
    pub fn from_serde(path: &serde_path_to_error::Path) -> Self {
        use serde_path_to_error::Segment as S;
        KeyPath(
            path.iter()
                .filter_map(|segment| match segment {
                    S::Seq { index } => Some(Segment::Index(*index)),
                    S::Map { key } => Some(Segment::Key(key.clone())),
                    _ => None,
                })
                .collect(),
        )
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(key) if i == 0 => f.write_str(key)?,
                Segment::Key(key) => write!(f, ".{key}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// A 1-based line and column in the config's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl Location {
    pub fn of(error: &serde_yaml_ng::Error) -> Option<Location> {
        let at = error.location()?;
        Some(Location {
            line: at.line(),
            column: at.column(),
        })
    }
}

/// Where `path` is in `text`: the key itself for a key, the item for a list
/// index. `None` for the root, or when the text has no such path.
pub fn locate(text: &str, path: &KeyPath) -> Option<Location> {
    if path.0.is_empty() {
        return None;
    }
    let walk = Find { path: &path.0 }.deserialize(serde_yaml_ng::Deserializer::from_str(text));
    // Only the planted error stops the walk: the text parsed before.
    Location::of(&walk.err()?)
}

/// Walks the value at hand down `path`.
struct Find<'p> {
    path: &'p [Segment],
}

impl<'de> DeserializeSeed<'de> for Find<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Find<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    // A scalar where the path goes on: not there.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_i128<E>(self, _: i128) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u128<E>(self, _: u128) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (want, rest) = match self.path.split_first() {
            Some((Segment::Key(key), rest)) => (Some(key.as_str()), rest),
            _ => (None, &[][..]),
        };
        // Every entry is read: the deserializer checks a mapping is used up.
        while let Some(hit) = map.next_key_seed(KeyMatch {
            want,
            last: rest.is_empty(),
        })? {
            match hit {
                true => map.next_value_seed(Find { path: rest })?,
                false => map.next_value::<IgnoredAny>().map(drop)?,
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (want, rest) = match self.path.split_first() {
            Some((Segment::Index(index), rest)) => (Some(*index), rest),
            _ => (None, &[][..]),
        };
        let mut index = 0;
        loop {
            let item = match want == Some(index) {
                true if rest.is_empty() => seq.next_element_seed(Here)?,
                true => seq.next_element_seed(Find { path: rest })?,
                false => seq.next_element::<IgnoredAny>()?.map(drop),
            };
            if item.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    /// A tagged value (`!tag value`): the path goes on inside it.
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        let (IgnoredAny, variant) = data.variant()?;
        de::VariantAccess::newtype_variant_seed(variant, self)
    }
}

/// A mapping key: whether it is the one wanted. The last key of the path
/// fails right there, so the error carries the key's position.
struct KeyMatch<'p> {
    want: Option<&'p str>,
    last: bool,
}

impl KeyMatch<'_> {
    fn check<E: de::Error>(self, key: &str) -> Result<bool, E> {
        let hit = self.want == Some(key);
        match hit && self.last {
            true => Err(E::custom("found")),
            false => Ok(hit),
        }
    }
}

impl<'de> DeserializeSeed<'de> for KeyMatch<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeyMatch<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        self.check(key)
    }

    fn visit_bool<E: de::Error>(self, key: bool) -> Result<bool, E> {
        self.check(&key.to_string())
    }

    fn visit_i64<E: de::Error>(self, key: i64) -> Result<bool, E> {
        self.check(&key.to_string())
    }

    fn visit_u64<E: de::Error>(self, key: u64) -> Result<bool, E> {
        self.check(&key.to_string())
    }

    fn visit_f64<E: de::Error>(self, key: f64) -> Result<bool, E> {
        self.check(&key.to_string())
    }

    fn visit_i128<E>(self, _: i128) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_u128<E>(self, _: u128) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_none<E>(self) -> Result<bool, E> {
        Ok(false)
    }

    // Keys that are collections or tagged: never a config key, read past.
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        IgnoredAny.visit_map(map).map(|_| false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        IgnoredAny.visit_seq(seq).map(|_| false)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<bool, A::Error> {
        IgnoredAny.visit_enum(data).map(|_| false)
    }
}

/// The list item wanted: fails on whatever it is, so the error carries the
/// item's position.
struct Here;

impl<'de> DeserializeSeed<'de> for Here {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(Here)
    }
}

impl<'de> Visitor<'de> for Here {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("nothing (the item looked for is found)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# a comment
agents:
  weather:
    name: W
    skills: [a, b]
  'qwen2.5': { skills: [c,
     d], tools: [x] }
  third:
    skills:
      - e
      - f
";

    fn at(path: KeyPath) -> Option<(usize, usize)> {
        locate(TEXT, &path).map(|l| (l.line, l.column))
    }

    #[test]
    fn finds_keys_and_items_in_block_and_flow_style() {
        let agents = || KeyPath::of(&["agents"]);
        assert_eq!(at(agents().key("weather").key("name")), Some((4, 5)));
        assert_eq!(
            at(agents().key("weather").key("skills").index(1)),
            Some((5, 17))
        );
        assert_eq!(
            at(agents().key("qwen2.5").key("skills").index(1)),
            Some((7, 6))
        );
        assert_eq!(at(agents().key("qwen2.5").key("tools")), Some((7, 10)));
        assert_eq!(
            at(agents().key("third").key("skills").index(1)),
            Some((11, 9))
        );
        assert_eq!(at(agents().key("third")), Some((8, 3)));
        assert_eq!(at(agents().key("nope")), None);
        assert_eq!(at(agents().key("weather").key("skills").index(5)), None);
        assert_eq!(at(KeyPath::default()), None);
        assert_eq!(
            agents().key("qwen2.5").key("skills").index(1).to_string(),
            "agents.qwen2.5.skills[1]"
        );
    }
}
