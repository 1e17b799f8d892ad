//! Request bodies of the daemon's API (`domusd.sock`, or TCP with a token;
//! routes in `api/daemon.openapi.json`).

use serde::{Deserialize, Serialize};

/// `POST /v1/domains`: an xl-style configuration file's text, with where it
/// came from (for relative paths) and `key=value` overrides.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// The configuration file's text.
    pub config: String,
    /// Its name, for messages (default `config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The directory relative paths in it are taken from (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// `key=value` settings that override the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<Vec<String>>,
}

/// `PUT /v1/domains/{dom}/memory`: the memory the guest keeps (balloon).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRequest {
    pub target_mib: u64,
}

/// `PUT /v1/domains/{dom}/maxmem`: the most memory the domain may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxmemRequest {
    pub maxmem_mib: u64,
}

/// `PUT /v1/domains/{dom}/name`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    pub name: String,
}

/// `PUT /v1/domains/{dom}/block-attach` and `network-attach`: an xl disk or
/// vif spec (a vif's may be left out: all defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    #[serde(default)]
    pub spec: Option<String>,
}

/// A string or a whole number, as a name or index may be given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NameOrNumber {
    Name(String),
    Number(u64),
}

impl std::fmt::Display for NameOrNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameOrNumber::Name(s) => f.write_str(s),
            NameOrNumber::Number(n) => write!(f, "{n}"),
        }
    }
}

/// `PUT /v1/domains/{dom}/block-detach` (`vdb`) and `network-detach` (an
/// index, 0 for net0, or a MAC address).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetachRequest {
    pub id: NameOrNumber,
}

/// `PUT /v1/domains/{dom}/vcpu-pin`: pins one vCPU (or all: `"all"` or left
/// out) to a host CPU list like `0-3,6`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinRequest {
    #[serde(default)]
    pub vcpu: Option<NameOrNumber>,
    pub cpus: String,
}

impl PinRequest {
    /// The vCPU asked for: `None` for all of them, or a message for a 400.
    pub fn vcpu(&self) -> Result<Option<usize>, String> {
        match &self.vcpu {
            None => Ok(None),
            Some(NameOrNumber::Name(s)) if s == "all" => Ok(None),
            Some(NameOrNumber::Number(n)) => usize::try_from(*n)
                .map(Some)
                .map_err(|_| format!("vCPU {n} is out of range")),
            Some(NameOrNumber::Name(s)) => Err(format!(
                "'vcpu' must be a vCPU number or \"all\", not {s:?}"
            )),
        }
    }
}

/// `PUT /v1/domains/{dom}/sched`: a credit-scheduler weight and cap (a
/// percentage of one CPU); a field left out or null is unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedRequest {
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub cap: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_body;

    #[test]
    fn requests_parse_and_refuse_what_they_do_not_know() {
        let c: CreateRequest =
            parse_body(br#"{"config": "name='a'", "overrides": ["memory=512"]}"#).unwrap();
        assert_eq!(c.file, None);
        assert_eq!(c.overrides.unwrap(), ["memory=512"]);
        let e = parse_body::<CreateRequest>(br#"{"config": "x", "colour": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `colour`"), "{e}");
        assert!(parse_body::<CreateRequest>(br#"{"overrides": "memory=1"}"#).is_err());
        let d: DetachRequest = parse_body(br#"{"id": 1}"#).unwrap();
        assert_eq!(d.id.to_string(), "1");
        let d: DetachRequest = parse_body(br#"{"id": "vdb"}"#).unwrap();
        assert_eq!(d.id.to_string(), "vdb");
        assert!(parse_body::<DetachRequest>(br#"{"id": 1.5}"#).is_err());
        let p: PinRequest = parse_body(br#"{"vcpu": "all", "cpus": "0-1"}"#).unwrap();
        assert_eq!(p.vcpu(), Ok(None));
        let p: PinRequest = parse_body(br#"{"vcpu": 3, "cpus": "1"}"#).unwrap();
        assert_eq!(p.vcpu(), Ok(Some(3)));
        let p: PinRequest = parse_body(br#"{"vcpu": "some", "cpus": "1"}"#).unwrap();
        assert!(p.vcpu().is_err());
        assert!(parse_body::<SchedRequest>(br#"{"weight": 5000000000}"#).is_err());
        assert!(parse_body::<SchedRequest>(br#"{"weight": -1}"#).is_err());
        let s: SchedRequest = parse_body(br#"{"cap": null}"#).unwrap();
        assert_eq!(s, SchedRequest::default());
        assert!(parse_body::<MemoryRequest>(br#"{"target_mib": "512"}"#).is_err());
    }
}
