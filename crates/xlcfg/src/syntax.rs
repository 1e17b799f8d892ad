//! The xl.cfg file syntax (xl.cfg(5)): `KEY = VALUE` settings, one per
//! line or separated by `;`, where a value is a quoted string ('...' or
//! "..."), a number, or a list `[ value, ... ]` that may span lines and
//! end with a comma. `#` starts a comment. `KEY += [ ... ]` appends to a
//! list set before.

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Num(f64),
    List(Vec<Value>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Str(s) => write!(f, "'{s}'"),
            Value::Num(n) => write!(f, "{n}"),
            Value::List(l) => {
                write!(f, "[")?;
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{v}")?;
                }
                write!(f, "]")
            }
        }
    }
}

/// One `KEY = VALUE`, with the line it starts on (1-based).
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    pub key: String,
    pub value: Value,
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct SyntaxError {
    pub line: usize,
    pub msg: String,
}

struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
    line: usize,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Num(f64),
    Eq,
    PlusEq,
    LBrack,
    RBrack,
    Comma,
    /// A newline or `;`.
    End,
    Eof,
}

impl<'a> Lexer<'a> {
    fn err(&self, msg: impl Into<String>) -> SyntaxError {
        SyntaxError {
            line: self.line,
            msg: msg.into(),
        }
    }

    fn next(&mut self) -> Result<(Tok, usize), SyntaxError> {
        loop {
            let Some(&c) = self.s.get(self.pos) else {
                return Ok((Tok::Eof, self.line));
            };
            match c {
                b' ' | b'\t' | b'\r' => self.pos += 1,
                b'#' => {
                    while self.s.get(self.pos).is_some_and(|c| *c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
        let line = self.line;
        let c = self.s[self.pos];
        self.pos += 1;
        let tok = match c {
            b'\n' => {
                self.line += 1;
                Tok::End
            }
            b';' => Tok::End,
            b'=' => Tok::Eq,
            b'+' if self.s.get(self.pos) == Some(&b'=') => {
                self.pos += 1;
                Tok::PlusEq
            }
            b'[' => Tok::LBrack,
            b']' => Tok::RBrack,
            b',' => Tok::Comma,
            b'\'' | b'"' => {
                let start = self.pos;
                loop {
                    match self.s.get(self.pos) {
                        None | Some(b'\n') => return Err(self.err("unterminated string")),
                        Some(q) if *q == c => break,
                        Some(_) => self.pos += 1,
                    }
                }
                let v = std::str::from_utf8(&self.s[start..self.pos])
                    .map_err(|_| self.err("string is not UTF-8"))?
                    .to_string();
                self.pos += 1;
                Tok::Str(v)
            }
            c if c.is_ascii_digit() || c == b'-' || c == b'.' => {
                let start = self.pos - 1;
                while self
                    .s
                    .get(self.pos)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'.')
                {
                    self.pos += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
                let n = if let Some(h) = t.strip_prefix("0x") {
                    u64::from_str_radix(h, 16).ok().map(|v| v as f64)
                } else {
                    t.parse::<f64>().ok()
                };
                Tok::Num(n.ok_or_else(|| self.err(format!("'{t}' is not a number")))?)
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.pos - 1;
                while self
                    .s
                    .get(self.pos)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
                {
                    self.pos += 1;
                }
                Tok::Ident(String::from_utf8_lossy(&self.s[start..self.pos]).into_owned())
            }
            c => return Err(self.err(format!("unexpected '{}'", char::from(c).escape_default()))),
        };
        Ok((tok, line))
    }
}

struct Parser<'a> {
    lex: Lexer<'a>,
    peeked: Option<(Tok, usize)>,
}

impl Parser<'_> {
    fn peek(&mut self) -> Result<&(Tok, usize), SyntaxError> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lex.next()?);
        }
        Ok(self.peeked.as_ref().expect("just filled"))
    }

    fn take(&mut self) -> Result<(Tok, usize), SyntaxError> {
        self.peek()?;
        Ok(self.peeked.take().expect("just peeked"))
    }

    fn value(&mut self, depth: usize) -> Result<Value, SyntaxError> {
        let (t, line) = self.take()?;
        let err = |msg: String| SyntaxError { line, msg };
        match t {
            Tok::Str(s) => Ok(Value::Str(s)),
            Tok::Num(n) => Ok(Value::Num(n)),
            Tok::LBrack if depth < 4 => {
                let mut items = Vec::new();
                loop {
                    // Newlines inside a list are free.
                    while self.peek()?.0 == Tok::End {
                        self.take()?;
                    }
                    if self.peek()?.0 == Tok::RBrack {
                        self.take()?;
                        return Ok(Value::List(items));
                    }
                    items.push(self.value(depth + 1)?);
                    while self.peek()?.0 == Tok::End {
                        self.take()?;
                    }
                    match self.take()? {
                        (Tok::Comma, _) => {}
                        (Tok::RBrack, _) => return Ok(Value::List(items)),
                        (t, l) => {
                            return Err(SyntaxError {
                                line: l,
                                msg: format!("expected ',' or ']' in a list, found {t:?}"),
                            })
                        }
                    }
                }
            }
            Tok::LBrack => Err(err("lists nested too deep".into())),
            Tok::Ident(i) => Err(err(format!(
                "'{i}' is not a value (strings need quotes: '{i}')"
            ))),
            t => Err(err(format!("expected a value, found {t:?}"))),
        }
    }
}

/// Parses a whole file.
pub fn parse(text: &str) -> Result<Vec<Setting>, SyntaxError> {
    let mut p = Parser {
        lex: Lexer {
            s: text.as_bytes(),
            pos: 0,
            line: 1,
        },
        peeked: None,
    };
    let mut out: Vec<Setting> = Vec::new();
    loop {
        let (t, line) = p.take()?;
        let key = match t {
            Tok::Eof => return Ok(out),
            Tok::End => continue,
            Tok::Ident(k) => k,
            t => {
                return Err(SyntaxError {
                    line,
                    msg: format!("expected a setting name, found {t:?}"),
                })
            }
        };
        let append = match p.take()? {
            (Tok::Eq, _) => false,
            (Tok::PlusEq, _) => true,
            (_, l) => {
                return Err(SyntaxError {
                    line: l,
                    msg: format!("expected '=' after '{key}'"),
                })
            }
        };
        let value = p.value(0)?;
        match p.take()? {
            (Tok::End | Tok::Eof, _) => {}
            (t, l) => {
                return Err(SyntaxError {
                    line: l,
                    msg: format!("unexpected {t:?} after the value of '{key}'"),
                })
            }
        }
        if append {
            let prev = out.iter_mut().rev().find(|s| s.key == key);
            match (prev, value) {
                (
                    Some(Setting {
                        value: Value::List(l),
                        ..
                    }),
                    Value::List(more),
                ) => l.extend(more),
                _ => {
                    return Err(SyntaxError {
                        line,
                        msg: format!("'{key} +=' needs a list, and a list set before"),
                    })
                }
            }
        } else {
            out.retain(|s| s.key != key);
            out.push(Setting { key, value, line });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typical_file() {
        let f = r#"
# a domain
name = "web-1"
memory = 512 ; vcpus = 2
disk = [ '/img/web.raw,raw,xvda,rw',
         "format=raw, vdev=xvdb, access=ro, target=/img/data.raw", ]
vif = ['mac=00:16:3e:00:00:01,bridge=br0']
cap = 0x10
"#;
        let s = parse(f).unwrap();
        let get = |k: &str| s.iter().find(|x| x.key == k).unwrap();
        assert_eq!(get("name").value, Value::Str("web-1".into()));
        assert_eq!(get("name").line, 3);
        assert_eq!(get("vcpus").value, Value::Num(2.0));
        assert_eq!(get("vcpus").line, 4);
        let Value::List(d) = &get("disk").value else {
            panic!()
        };
        assert_eq!(d.len(), 2);
        assert_eq!(get("vif").line, 7);
        assert_eq!(get("cap").value, Value::Num(16.0));
    }

    #[test]
    fn appending_and_overriding() {
        let s = parse("disk = ['a']\ndisk += ['b']\nname='x'\nname='y'").unwrap();
        assert_eq!(
            s[0].value,
            Value::List(vec![Value::Str("a".into()), Value::Str("b".into())])
        );
        assert_eq!(s[1].value, Value::Str("y".into()));
        assert_eq!(s[1].line, 4);
    }

    #[test]
    fn errors_name_the_line() {
        for (text, line) in [
            ("name = 'unterminated", 1),
            ("\n\nname = bare", 3),
            ("name 'x'", 1),
            ("= 3", 1),
            ("disk = ['a' 'b']", 1),
            ("disk = ['a',\n", 2),
            ("memory = 12abc", 1),
            ("memory = 1 2", 1),
            ("x += 3", 1),
            ("x = [[[[[1]]]]]", 1),
            ("name = 'a' $", 1),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
        }
    }

    #[test]
    fn never_panics_on_garbage() {
        let mut seed = 7u64;
        for _ in 0..2000 {
            let mut s = Vec::new();
            for _ in 0..(seed % 40) {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                const ALPHABET: &[u8] = b"ab=[]'\",;#\n +-0x9.e";
                s.push(ALPHABET[(seed >> 33) as usize % ALPHABET.len()]);
            }
            let _ = parse(&String::from_utf8_lossy(&s));
        }
    }
}
