package sim

import (
	"encoding/json"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
)

// The simulated model decodes greedily: what it writes is a function of
// what it was asked, never of which worker, slot or sequence wrote it, so
// two workers asked the same question write the same answer, and a worker
// asked to continue an answer another one began writes exactly its rest.
//
// A request's conversation base is its prompt without any prefill of the
// answer: a completion prompt's text up to where a run of this model's own
// output begins, or a chat's messages without a trailing assistant message
// the engine continues (llama-server prefills one always; vLLM and SGLang
// when the request sets continue_final_message). Token i of the answer to
// base B is a word of vocabulary chosen by a hash of (B, i), and the answer
// stops of itself (EOS) at a length drawn from the output distribution by
// a generator seeded with B's hash. A prefill that is exactly the first k
// tokens of B's answer resumes it at token k+1; any other prefill is part
// of the base.

// vocabulary supplies the simulated tokens' text. Every word begins with
// a space or is one punctuation mark, and none ends another, so a text
// made of them splits into words one way only, from either end.
var vocabulary = [...]string{" the", " GPU", " is", " busy", " and", " a", " token", " stream", " of", " words", ",", " then", " more", " text", ".", " It"}

// answer is the deterministic output of one conversation base.
type answer struct{ h uint64 }

func answerTo(base string) answer {
	f := fnv.New64a()
	f.Write([]byte(base))
	return answer{h: f.Sum64()}
}

// token is the text of token i (1-based).
func (a answer) token(i int) string {
	x := a.h + uint64(i)*0x9e3779b97f4a7c15 // splitmix64 of (base, i)
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return vocabulary[x%uint64(len(vocabulary))]
}

// length is where the answer stops of itself: a draw of the output
// distribution (Params.OutputMedian, OutputSigma, clamped to OutputMin,
// OutputMax) seeded by the base.
func (a answer) length(p Params) int {
	r := rand.New(rand.NewPCG(a.h, a.h^0x9e3779b97f4a7c15))
	n := int(math.Round(p.OutputMedian * math.Exp(p.OutputSigma*r.NormFloat64())))
	return min(max(n, p.OutputMin), p.OutputMax)
}

// prefilled reports how many leading tokens of the answer text is, and
// false when it is not a whole number of them.
func (a answer) prefilled(text string) (int, bool) {
	k := 0
	for text != "" {
		t := a.token(k + 1)
		if !strings.HasPrefix(text, t) {
			return 0, false
		}
		text = text[len(t):]
		k++
	}
	return k, true
}

// maxPeel bounds how many trailing words of a completion prompt are tried
// as a prefill of its own answer.
const maxPeel = 8192

// splitCompletion splits a completion prompt into its base and the number
// of tokens of the base's answer it ends with: the longest such run of
// trailing words, so that a prompt extended by its own answer's first k
// tokens is read as that prompt resumed at k+1.
func splitCompletion(prompt string) (base string, k int) {
	cuts := []int{} // word boundaries from the end, nearest first
	for end := len(prompt); len(cuts) < maxPeel; {
		w := lastWord(prompt[:end])
		if w == 0 {
			break
		}
		end -= w
		cuts = append(cuts, end)
	}
	for j := len(cuts) - 1; j >= 0; j-- {
		b := prompt[:cuts[j]]
		if n, ok := answerTo(b).prefilled(prompt[cuts[j]:]); ok && n == j+1 {
			return b, n
		}
	}
	return prompt, 0
}

// lastWord returns the length of the vocabulary word s ends with, or 0.
func lastWord(s string) int {
	for _, w := range vocabulary {
		if strings.HasSuffix(s, w) {
			return len(w)
		}
	}
	return 0
}

// chatMessage is one message as the simulator reads it.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// contentText is a message's text: a string, or its text parts joined.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	json.Unmarshal(raw, &parts)
	var sb strings.Builder
	for _, p := range parts {
		sb.WriteString(p.Text)
	}
	return sb.String()
}

// splitChat splits a chat into its base and the tokens of the base's
// answer a trailing assistant message prefills, when prefill says the
// engine continues such a message. A prefill that is not the start of the
// answer is a message of the base like any other.
// n is the number of messages in the base.
func splitChat(msgs []chatMessage, prefill bool) (base string, k, n int) {
	render := func(ms []chatMessage) string {
		var sb strings.Builder
		for _, m := range ms {
			sb.WriteString(m.Role)
			sb.WriteString(": ")
			sb.WriteString(contentText(m.Content))
			sb.WriteString("\n")
		}
		return sb.String()
	}
	if n := len(msgs); prefill && n > 1 && msgs[n-1].Role == "assistant" {
		b := render(msgs[:n-1])
		if k, ok := answerTo(b).prefilled(contentText(msgs[n-1].Content)); ok {
			return b, k, n - 1
		}
	}
	return render(msgs), 0, len(msgs)
}

// Reference returns the text a server with parameters p (emulating
// emulate, as Options.Emulate) answers body with on path, and its tokens,
// without running it: what a stream of it must read however many workers
// wrote it. Tests compare continued streams with it.
func Reference(path string, body []byte, p Params, emulate string) (text string, tokens int, err error) {
	kind := kindChat
	switch path {
	case "/v1/completions", "/completions":
		kind = kindCompletions
	case "/completion":
		kind = kindNative
	}
	g, err := parseGenRequest(kind, strings.NewReader(string(body)), emulate)
	if err != nil {
		return "", 0, err
	}
	n := g.req.MaxTokens
	if !g.req.IgnoreEOS {
		rest := g.ans.length(p) - g.skip
		if n <= 0 || rest < n {
			n = max(rest, 0)
		}
	} else if n <= 0 {
		n = p.OutputMax
	}
	var sb strings.Builder
	for i := 1; i <= n; i++ {
		sb.WriteString(g.ans.token(g.skip + i))
	}
	return sb.String(), n, nil
}
