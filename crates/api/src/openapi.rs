//! Checking an OpenAPI document's schemas against the types of this crate:
//! the tests of the VMM's and the daemon's API use [`check_schema`] on
//! sample values of each request and answer type.

use std::collections::BTreeSet;

use serde_json::Value;

/// The JSON type OpenAPI gives a value.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A schema with its `$ref` (or a one-element `allOf` of one) followed.
pub fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    let target = schema["$ref"]
        .as_str()
        .or_else(|| schema["allOf"][0]["$ref"].as_str());
    match target {
        Some(r) => &doc["components"]["schemas"][r.rsplit('/').next().unwrap_or_default()],
        None => schema,
    }
}

/// Checks `samples` (one type, serialized) against its OpenAPI schema:
/// the same fields, each of the documented JSON type (null only where
/// nullable, strings within an enum), and `required` naming every field
/// when `all_required` (answers always write every field).
pub fn check_schema(
    doc: &Value,
    what: &str,
    schema: &Value,
    samples: &[Value],
    all_required: bool,
) {
    let schema = resolve(doc, schema);
    let props = schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{what}: no properties in {schema}"));
    let documented: BTreeSet<&String> = props.keys().collect();
    for sample in samples {
        let fields = sample.as_object().unwrap();
        assert_eq!(
            fields.keys().collect::<BTreeSet<_>>(),
            documented,
            "{what}: the type's fields and the schema's"
        );
        for (k, v) in fields {
            let p = &props[k];
            if v.is_null() {
                assert_eq!(p["nullable"], true, "{what}.{k} is null but not nullable");
                continue;
            }
            // One type, or any of a oneOf's.
            let p = resolve(doc, p);
            let wants: Vec<&str> = match p["oneOf"].as_array() {
                Some(alts) => alts
                    .iter()
                    .filter_map(|a| resolve(doc, a)["type"].as_str())
                    .collect(),
                None => p["type"].as_str().into_iter().collect(),
            };
            let got = kind(v);
            assert!(
                wants
                    .iter()
                    .any(|w| *w == got || (got == "integer" && *w == "number")),
                "{what}.{k}: {got} where the schema says {wants:?}"
            );
            if let Some(e) = p["enum"].as_array() {
                assert!(e.contains(v), "{what}.{k}: {v} is not in {e:?}");
            }
        }
    }
    if all_required {
        let required: BTreeSet<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert_eq!(
            required,
            documented.iter().map(|k| k.as_str()).collect(),
            "{what}: required"
        );
    }
}
