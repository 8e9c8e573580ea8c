//! Injected arguments: parameters the system supplies, not the model (the
//! user a request is for, a tenant header, a constant). They are removed
//! from the schema the model sees and set at call time, overriding whatever
//! the model passed.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::CallContext;
use crate::config::file::InjectFile;

#[derive(Debug, Clone, Default)]
pub struct Injection {
    params: Vec<(String, Source)>,
}

#[derive(Debug, Clone)]
enum Source {
    /// Client-controlled: the request's `user`.
    RequestUser,
    /// The request's session id (`session`'s cascade).
    Session,
    /// The matched client key's name: set by the operator, unforgeable.
    KeyName,
    Header(http::HeaderName),
    Value(Value),
}

impl Injection {
    pub fn from_file(file: &BTreeMap<String, InjectFile>) -> Result<Self, String> {
        let params = file
            .iter()
            .map(|(param, source)| {
                let source = match source {
                    InjectFile { request: None, header: None, value: None, env: None, api_key: Some(field) } => {
                        if field != "name" {
                            return Err(format!(
                                "inject.{param}: the key field `{field}` is not supported (only `name`)"
                            ));
                        }
                        Source::KeyName
                    }
                    InjectFile { request: Some(field), header: None, value: None, env: None, api_key: None } => {
                        match field.as_str() {
                            "user" => Source::RequestUser,
                            "session" => Source::Session,
                            _ => return Err(format!(
                                "inject.{param}: the request field `{field}` is not supported (`user` or `session`)"
                            )),
                        }
                    }
                    InjectFile { request: None, header: Some(name), value: None, env: None, api_key: None } => Source::Header(
                        http::HeaderName::try_from(name.as_str())
                            .map_err(|_| format!("inject.{param}: invalid header name `{name}`"))?,
                    ),
                    InjectFile { request: None, header: None, value: Some(value), env: None, api_key: None } => {
                        Source::Value(value.clone())
                    }
                    InjectFile { request: None, header: None, value: None, env: Some(var), api_key: None } => {
                        Source::Value(Value::String(std::env::var(var).map_err(|_| {
                            format!("inject.{param}: environment variable `{var}` is not set")
                        })?))
                    }
                    _ => {
                        return Err(format!(
                            "inject.{param}: give exactly one of `request`, `header`, `value`, `env`, `api_key`"
                        ))
                    }
                };
                Ok((param.clone(), source))
            })
            .collect::<Result<_, _>>()?;
        Ok(Injection { params })
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// The request headers it reads.
    pub fn headers(&self) -> impl Iterator<Item = &http::HeaderName> {
        self.params.iter().filter_map(|(_, source)| match source {
            Source::Header(name) => Some(name),
            _ => None,
        })
    }

    /// The injected parameters `schema` declares: an MCP server's injection
    /// reaches only the tools that take the parameter.
    pub fn declared_in(&self, schema: &Value) -> Injection {
        let properties = schema.get("properties").and_then(Value::as_object);
        Injection {
            params: self
                .params
                .iter()
                .filter(|(param, _)| properties.is_some_and(|p| p.contains_key(param)))
                .cloned()
                .collect(),
        }
    }

    /// `schema` without the injected parameters (in `properties` and `required`).
    pub fn hide(&self, schema: &mut Value) {
        if self.params.is_empty() {
            return;
        }
        if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            for (param, _) in &self.params {
                properties.remove(param);
            }
        }
        if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
            required.retain(|r| !self.params.iter().any(|(p, _)| r.as_str() == Some(p)));
        }
    }

    /// Sets every injected parameter in `arguments`. A source with no value
    /// for this request (no `user`, a missing header) removes the parameter,
    /// so the model can never fill it in.
    pub fn apply(&self, arguments: &mut Map<String, Value>, ctx: &CallContext) {
        for (param, source) in &self.params {
            let value = match source {
                Source::RequestUser => ctx.user.clone().map(Value::String),
                Source::Session => Some(Value::String(ctx.session.clone())),
                Source::KeyName => ctx.key_name.clone().map(Value::String),
                Source::Header(name) => ctx
                    .headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| Value::String(v.to_owned())),
                Source::Value(value) => Some(value.clone()),
            };
            match value {
                Some(value) => arguments.insert(param.clone(), value),
                None => arguments.remove(param),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hides_and_overrides_injected_parameters() {
        let file: BTreeMap<String, InjectFile> =
            serde_yaml_ng::from_str("user_id: { request: user }\nregion: { value: eu }").unwrap();
        let injection = Injection::from_file(&file).unwrap();
        let mut schema = json!({"type":"object","properties":{"user_id":{},"region":{},"q":{}},"required":["user_id","q"]});
        let declared = injection.declared_in(&json!({"properties": {"region": {}}}));
        assert_eq!(declared.params.len(), 1);
        assert_eq!(declared.params[0].0, "region");
        injection.hide(&mut schema);
        assert_eq!(
            schema,
            json!({"type":"object","properties":{"q":{}},"required":["q"]})
        );
    }
}
