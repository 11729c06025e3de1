//! Generated tokens to text, one token at a time: text is handed out only once it is final —
//! not while the last token ends inside a UTF-8 character (the decoder's U+FFFD), nor while
//! its end could be the start of a stop string — and generation stops at the first stop
//! string, which is not part of the text (OpenAI's `stop`).

use brigade::models::tokenizer::Tokenizer;

pub struct Detok<'a> {
    /// `None`: the model has no tokenizer; text stays empty (clients read token ids).
    tok: Option<&'a Tokenizer>,
    stops: Vec<String>,
    ids: Vec<u32>,
    /// Decoded text so far (final up to `sent`).
    text: String,
    sent: usize,
    pub stopped: bool,
}

impl<'a> Detok<'a> {
    pub fn new(tok: Option<&'a Tokenizer>, stops: &[String]) -> Detok<'a> {
        Detok { tok, stops: stops.to_vec(), ids: Vec::new(), text: String::new(), sent: 0, stopped: false }
    }

    /// Adds a generated token; returns the text that became final. After a stop string,
    /// `stopped` is set and further tokens are ignored.
    pub fn push(&mut self, id: u32) -> String {
        if self.stopped {
            return String::new();
        }
        self.ids.push(id);
        let Some(tok) = self.tok else { return String::new() };
        let full = tok.decode(&self.ids);
        if full.ends_with('\u{FFFD}') || !full.is_char_boundary(self.sent) || !full.starts_with(&self.text[..self.sent])
        {
            // an unfinished character, or a decoder that rewrote earlier text: wait
            return String::new();
        }
        self.text = full;
        // the first stop string in the text not yet final
        let from =
            floor_boundary(&self.text, self.sent.saturating_sub(self.stops.iter().map(String::len).max().unwrap_or(0)));
        let hit = self.stops.iter().filter(|s| !s.is_empty()).filter_map(|s| self.text[from..].find(s.as_str())).min();
        if let Some(p) = hit {
            self.text.truncate(from + p);
            self.stopped = true;
            return self.take(self.text.len());
        }
        // hold back the longest tail that begins a stop string
        let hold = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&k| s.is_char_boundary(k) && self.text.ends_with(&s[..k])))
            .max()
            .unwrap_or(0);
        self.take(self.text.len() - hold)
    }

    /// The rest of the text at the end of generation.
    pub fn finish(&mut self) -> String {
        if let Some(tok) = self.tok {
            if !self.stopped {
                let full = tok.decode(&self.ids);
                if full.is_char_boundary(self.sent) && full.starts_with(&self.text[..self.sent]) {
                    self.text = full;
                }
            }
        }
        self.take(self.text.len())
    }

    fn take(&mut self, upto: usize) -> String {
        let upto = upto.max(self.sent);
        let s = self.text[self.sent..upto].to_string();
        self.sent = upto;
        s
    }

    /// The text handed out so far (all of it once finished).
    pub fn text(&self) -> &str {
        &self.text[..self.sent]
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// One token as text, for log-probabilities: its decoding, or `token_id:N` without a tokenizer.
pub fn token_text(tok: Option<&Tokenizer>, id: u32) -> String {
    match tok {
        Some(t) => t.decode(&[id]),
        None => format!("token_id:{id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, stops: &[&str]) -> (Vec<String>, String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let tok = Tokenizer::Bytes;
        let mut d = Detok::new(Some(&tok), &stops);
        let mut pieces = Vec::new();
        for b in text.bytes() {
            pieces.push(d.push(b as u32));
            if d.stopped {
                break;
            }
        }
        pieces.push(d.finish());
        let all = pieces.concat();
        (pieces, all, d.stopped)
    }

    #[test]
    fn multibyte_characters_come_out_whole() {
        let (pieces, all, stopped) = run("aé€😀b", &[]);
        assert_eq!(all, "aé€😀b");
        assert!(!stopped);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
        // é is two bytes: nothing after its first
        assert_eq!(&pieces[..3], ["a", "", "é"]);
    }

    #[test]
    fn stop_strings_end_the_text_before_them() {
        assert_eq!(run("hello world. bye", &["."]).1, "hello world");
        assert_eq!(run("one\n\ntwo", &["xyz", "\n\n"]).1, "one");
        // the earliest stop wins, even if a longer one started earlier
        assert_eq!(run("abcde", &["bcdx", "cd"]).1, "ab");
        // no stop: all of it
        let (_, all, stopped) = run("abc", &["x"]);
        assert_eq!((all.as_str(), stopped), ("abc", false));
        // a stop across multibyte characters
        assert_eq!(run("naïve€end", &["€e"]).1, "naïve");
    }

    #[test]
    fn a_possible_stop_start_is_held_back_until_decided() {
        let (pieces, all, _) = run("ab<|en|x", &["<|end|>"]);
        assert_eq!(all, "ab<|en|x");
        // "<", "<|", "<|e", "<|en" were held: nothing after "ab" until the next "|" ruled
        // the stop out
        assert_eq!(pieces[..6].concat(), "ab");
        assert_eq!(pieces[6], "<|en|");
    }
}
