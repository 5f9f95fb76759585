package prefix

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Anthropic Messages API requests (POST /v1/messages), as the router and
// the simulator read them: the system prompt, the tool definitions and the
// messages, decoded once into the blocks RenderAnthropic writes.
//
// A message's content is a string or an array of content blocks (text,
// image, document, tool_use, tool_result, thinking, redacted_thinking, and
// types added later); a tool_result's content is a string or an array of
// blocks again; the system prompt is a string or an array of text blocks.
// Decoding never fails on a content of the wrong shape: it is marked
// (AnthropicContent.Bad) for the caller to refuse with the field's name.

// AnthropicBlock is one content block, with the fields RenderAnthropic
// reads. cache_control and citations are not read: Claude Code and other
// clients move a cache_control breakpoint to the latest message on every
// turn, and a rendering that counted it would change the earlier blocks'
// text, so the next turn's prefix would no longer match.
type AnthropicBlock struct {
	Type      string           `json:"type"`
	Text      *string          `json:"text"`     // text
	Thinking  *string          `json:"thinking"` // thinking
	Data      *string          `json:"data"`     // redacted_thinking
	Name      string           `json:"name"`     // tool_use
	Input     json.RawMessage  `json:"input"`    // tool_use
	ToolUseID string           `json:"tool_use_id"`
	Content   AnthropicContent `json:"content"` // tool_result
	Source    json.RawMessage  `json:"source"`  // image, document
}

// Media reports whether the block carries media (an image or a document),
// whose tokens its bytes do not tell.
func (b *AnthropicBlock) Media() bool { return b.Type == "image" || b.Type == "document" }

// AnthropicContent is a content field: a string (one text block) or an
// array of blocks. Bad says what is wrong with a value of another shape
// ("" when none); such a value renders as nothing.
type AnthropicContent struct {
	Blocks []AnthropicBlock
	Bad    string
}

// UnmarshalJSON reads a string or an array of blocks; it never fails.
func (c *AnthropicContent) UnmarshalJSON(b []byte) error {
	c.Blocks, c.Bad = c.Blocks[:0], ""
	b = bytes.TrimSpace(b)
	switch {
	case len(b) == 0 || string(b) == "null":
		return nil
	case b[0] == '"':
		var s string
		if json.Unmarshal(b, &s) != nil {
			c.Bad = "must be a string or an array of content blocks"
			return nil
		}
		c.Blocks = append(c.Blocks, AnthropicBlock{Type: "text", Text: &s})
	case b[0] == '[':
		if err := json.Unmarshal(b, &c.Blocks); err != nil {
			c.Blocks, c.Bad = nil, "must be an array of content blocks (objects with a \"type\")"
			return nil
		}
		for i := range c.Blocks {
			if c.Blocks[i].Type == "" {
				c.Bad = "holds a content block without a \"type\""
			} else if c.Blocks[i].Content.Bad != "" {
				c.Bad = "holds a tool_result whose content " + c.Blocks[i].Content.Bad
			}
		}
	default:
		c.Bad = "must be a string or an array of content blocks"
	}
	return nil
}

// AnthropicMessage is one message of the conversation.
type AnthropicMessage struct {
	Role    string           `json:"role"`
	Content AnthropicContent `json:"content"`
}

// AnthropicTool is one tool definition, as the model's prompt holds it.
type AnthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// RenderAnthropic writes the canonical text of a Messages request to w:
// the tools, the system prompt, then each message as Render writes a chat
// message ("<|role|>\n", its content, "\n"), each block by what the model
// reads of it (a text's text, a tool_use's name and input, a
// tool_result's id and content, a media block's source). As with Render,
// the rendering of a conversation is a prefix of the rendering of the same
// conversation with more messages, which is what prefix matching needs.
// It returns the media blocks met.
func RenderAnthropic(w TextWriter, system AnthropicContent, tools []AnthropicTool, msgs []AnthropicMessage) (media int) {
	if len(tools) > 0 {
		w.WriteString("<|tools|>\n")
		for _, t := range tools {
			w.WriteString(t.Name)
			w.WriteString("\n")
			w.WriteString(t.Description)
			w.WriteString("\n")
			w.Write(t.InputSchema)
			w.WriteString("\n")
		}
	}
	if len(system.Blocks) > 0 {
		w.WriteString("<|system|>\n")
		media += renderBlocks(w, system.Blocks)
		w.WriteString("\n")
	}
	for _, m := range msgs {
		w.WriteString("<|")
		w.WriteString(m.Role)
		w.WriteString("|>\n")
		media += renderBlocks(w, m.Content.Blocks)
		w.WriteString("\n")
	}
	return media
}

func renderBlocks(w TextWriter, blocks []AnthropicBlock) (media int) {
	for i := range blocks {
		b := &blocks[i]
		switch {
		case b.Text != nil:
			w.WriteString(*b.Text)
		case b.Thinking != nil:
			w.WriteString(*b.Thinking)
		case b.Data != nil:
			w.WriteString(*b.Data)
		case b.Type == "tool_use":
			w.WriteString("<tool_use ")
			w.WriteString(b.Name)
			w.WriteString(">")
			w.Write(b.Input)
		case b.Type == "tool_result":
			w.WriteString("<tool_result ")
			w.WriteString(b.ToolUseID)
			w.WriteString(">")
			media += renderBlocks(w, b.Content.Blocks)
		case b.Media():
			media++
			w.Write(b.Source)
		default:
			w.WriteString(b.Type)
		}
	}
	return media
}

// AnthropicText is the text RenderAnthropic writes, with the media blocks
// met; Text(s, n) of it is the request's block hashes.
func AnthropicText(system AnthropicContent, tools []AnthropicTool, msgs []AnthropicMessage) (string, int) {
	var b strings.Builder
	media := RenderAnthropic(&b, system, tools, msgs)
	return b.String(), media
}
