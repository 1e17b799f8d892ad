//! CPUID overrides: bits of what a domain's vCPUs see when they execute
//! CPUID, forced to 0 or 1 after Domus has made its own answer (KVM's
//! supported list, the domain's topology, the processor's name). Written
//! as xl's xend form, `cpuid = ["LEAF[,SUBLEAF]:REG=BITS,..."]`, where
//! BITS is 32 characters, the most significant bit first, each `1` (set),
//! `0` (clear) or `x` (as Domus makes it; xl's `k` and `s`, "as the
//! host", mean the same here, since Domus passes the host's bits through
//! KVM's list).

use serde::{Deserialize, Serialize};

/// One of CPUID's output registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Register {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

impl Register {
    pub fn as_str(self) -> &'static str {
        match self {
            Register::Eax => "eax",
            Register::Ebx => "ebx",
            Register::Ecx => "ecx",
            Register::Edx => "edx",
        }
    }
}

/// Bits of one register of one leaf (and subleaf) forced to 1 (`ones`)
/// and to 0 (`zeros`); the others stay as Domus makes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuidRule {
    pub leaf: u32,
    /// ECX's input; 0 for a leaf that has no subleaves.
    #[serde(default)]
    pub subleaf: u32,
    pub register: Register,
    #[serde(default)]
    pub ones: u32,
    #[serde(default)]
    pub zeros: u32,
}

impl CpuidRule {
    /// Refuses a rule that forces one bit both ways (possible in JSON,
    /// not in the xend form).
    pub fn check(&self) -> Result<(), String> {
        match self.ones & self.zeros {
            0 => Ok(()),
            both => Err(format!(
                "cpuid rule {self}: bits {both:#x} are forced to both 1 and 0"
            )),
        }
    }

    /// `value` with this rule's bits forced.
    pub fn apply(&self, value: u32) -> u32 {
        (value | self.ones) & !self.zeros
    }
}

impl std::fmt::Display for CpuidRule {
    /// The xend form, one register: `0x80000006:edx=0000...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.leaf)?;
        if self.subleaf != 0 {
            write!(f, ",{}", self.subleaf)?;
        }
        write!(f, ":{}=", self.register.as_str())?;
        for bit in (0..32).rev() {
            let c = match (self.ones >> bit & 1, self.zeros >> bit & 1) {
                (1, 0) => '1',
                (0, 1) => '0',
                (0, 0) => 'x',
                _ => '?',
            };
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

/// A number as xl writes one: decimal or `0x` hexadecimal.
fn number(s: &str) -> Option<u32> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses one entry of xl's xend form, `LEAF[,SUBLEAF]:REG=BITS[,REG=BITS]`
/// (`"1:ecx=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0"` clears bit 0 of leaf 1's
/// ECX): one rule per register.
pub fn parse_xend(s: &str) -> Result<Vec<CpuidRule>, String> {
    let bad = |why: String| Err(format!("cpuid '{}': {why}", s.escape_debug()));
    let Some((input, regs)) = s.split_once(':') else {
        return bad("not LEAF[,SUBLEAF]:REG=BITS (no ':')".into());
    };
    let (leaf, subleaf) = match input.split_once(',') {
        Some((l, sub)) => (l, Some(sub)),
        None => (input, None),
    };
    let Some(leaf) = number(leaf) else {
        return bad(format!("leaf '{leaf}' is not a number"));
    };
    let subleaf = match subleaf.map(|sub| (sub, number(sub))) {
        None => 0,
        Some((_, Some(n))) => n,
        Some((sub, None)) => return bad(format!("subleaf '{sub}' is not a number")),
    };
    let mut rules = Vec::new();
    for part in regs.split(',') {
        let Some((reg, bits)) = part.split_once('=') else {
            return bad(format!("'{part}' is not REG=BITS"));
        };
        let register = match reg.trim() {
            "eax" => Register::Eax,
            "ebx" => Register::Ebx,
            "ecx" => Register::Ecx,
            "edx" => Register::Edx,
            r => return bad(format!("'{r}' is not eax, ebx, ecx or edx")),
        };
        let bits = bits.trim();
        if bits.chars().count() != 32 {
            return bad(format!(
                "{reg}'s bits are {} characters, not 32",
                bits.chars().count()
            ));
        }
        let (mut ones, mut zeros) = (0u32, 0u32);
        for (i, c) in bits.chars().enumerate() {
            let bit = 1u32 << (31 - i);
            match c {
                '1' => ones |= bit,
                '0' => zeros |= bit,
                'x' | 'k' | 's' => {}
                c => {
                    return bad(format!(
                        "'{}' in {reg}'s bits is not 0, 1, x, k or s",
                        c.escape_debug()
                    ))
                }
            }
        }
        rules.push(CpuidRule {
            leaf,
            subleaf,
            register,
            ones,
            zeros,
        });
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xend_entries_parse_into_one_rule_per_register() {
        let r = parse_xend(
            "1:ecx=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0,edx=xx0xxxxxxxxxxxxxxxxxxxxxxxxxxxx1",
        )
        .unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].leaf, r[0].subleaf, r[0].register),
            (1, 0, Register::Ecx)
        );
        assert_eq!((r[0].ones, r[0].zeros), (0, 1));
        assert_eq!((r[1].ones, r[1].zeros), (1, 1 << 29));
        let r = parse_xend("0x8000001d,3:eax=kkkkkk000000000000ssssssssssssss").unwrap();
        assert_eq!((r[0].leaf, r[0].subleaf), (0x8000_001d, 3));
        assert_eq!(r[0].zeros, 0xfff << 14);
        assert_eq!(r[0].apply(0xffff_ffff), !(0xfff << 14));
    }

    #[test]
    fn a_rule_prints_as_it_is_written() {
        let text = "0x80000006:edx=00000000000000000000000000000000";
        let r = parse_xend(text).unwrap();
        assert_eq!(r[0].to_string(), text);
        let text = "0x7,1:ebx=1xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0";
        assert_eq!(parse_xend(text).unwrap()[0].to_string(), text);
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (entry, says) in [
            ("1", "no ':'"),
            ("one:eax=00000000000000000000000000000000", "leaf 'one'"),
            ("1,z:eax=00000000000000000000000000000000", "subleaf 'z'"),
            ("1:eax", "not REG=BITS"),
            ("1:esi=00000000000000000000000000000000", "'esi'"),
            ("1:eax=0000", "4 characters"),
            ("1:eax=0000000000000000000000000000000y", "'y'"),
            ("0x1ffffffff:eax=00000000000000000000000000000000", "leaf"),
        ] {
            let e = parse_xend(entry).unwrap_err();
            assert!(e.contains(says), "{entry}: {e}");
        }
    }

    #[test]
    fn json_rules_forcing_a_bit_both_ways_are_refused() {
        let r: CpuidRule =
            crate::parse_body(br#"{"leaf": 1, "register": "ecx", "ones": 3, "zeros": 2}"#).unwrap();
        assert!(r.check().unwrap_err().contains("0x2"));
        assert!(crate::parse_body::<CpuidRule>(br#"{"leaf": 1, "register": "esi"}"#).is_err());
    }
}
