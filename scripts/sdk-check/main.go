// Command sdk-check drives a running Sluice with the official Anthropic
// and OpenAI Go SDKs, as a client would, and reports what each call got:
// whole and streamed answers (accumulated by the SDKs' own helpers), token
// counting, model listing, the Responses API, and the SDKs' parsing of
// Sluice's error answers. It is its own module so that the SDKs stay out
// of Sluice's go.mod; ../sdk-check.sh builds Sluice, starts `sluice demo`
// and runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	oopt "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
)

func main() {
	base := flag.String("base", "http://127.0.0.1:8080", "Sluice's address")
	model := flag.String("model", "", "model to ask for")
	flag.Parse()
	ctx := context.Background()
	fails := 0
	check := func(name string, err error) {
		if err != nil {
			fails++
			fmt.Printf("FAIL %s: %v\n", name, err)
			return
		}
		fmt.Printf("ok   %s\n", name)
	}

	ac := anthropic.NewClient(aopt.WithBaseURL(*base), aopt.WithAPIKey("sk-test"), aopt.WithMaxRetries(0))
	msg, err := ac.Messages.New(ctx, anthropic.MessageNewParams{
		Model: anthropic.Model(*model), MaxTokens: 32,
		System:   []anthropic.TextBlockParam{{Text: "You are terse."}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say hello."))},
	})
	if err == nil && (len(msg.Content) == 0 || msg.Content[0].Text == "" || msg.Usage.OutputTokens == 0) {
		err = fmt.Errorf("empty answer: %+v", msg)
	}
	check("anthropic Messages.New", err)

	stream := ac.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
		Model: anthropic.Model(*model), MaxTokens: 32,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Count to five."))},
	})
	var acc anthropic.Message
	events := 0
	for stream.Next() {
		ev := stream.Current()
		events++
		if e := acc.Accumulate(ev); e != nil {
			err = e
			break
		}
	}
	if err == nil {
		err = stream.Err()
	}
	if err == nil && (len(acc.Content) == 0 || acc.Content[0].Text == "" || acc.Usage.OutputTokens == 0 || acc.StopReason == "") {
		err = fmt.Errorf("accumulated %d events into %+v", events, acc)
	}
	check("anthropic Messages.NewStreaming + Accumulate", err)

	_, err = ac.Messages.New(ctx, anthropic.MessageNewParams{
		Model: "no-such-model", MaxTokens: 8,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	})
	var aerr *anthropic.Error
	switch {
	case err == nil:
		err = errors.New("no error for an unknown model")
	case !errors.As(err, &aerr):
		err = fmt.Errorf("not an *anthropic.Error: %T %v", err, err)
	case aerr.StatusCode != 404 || !strings.Contains(aerr.RawJSON(), "not_found_error"):
		err = fmt.Errorf("status %d body %s", aerr.StatusCode, aerr.RawJSON())
	default:
		err = nil
	}
	check("anthropic unknown model is a 404 not_found_error the SDK parses", err)

	cnt, err := ac.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{
		Model:    anthropic.Model(*model),
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("How many tokens is this?"))},
	})
	if err == nil && cnt.InputTokens <= 0 {
		err = fmt.Errorf("input_tokens %d", cnt.InputTokens)
	}
	check("anthropic Messages.CountTokens", err)

	oc := openai.NewClient(oopt.WithBaseURL(*base+"/v1"), oopt.WithAPIKey("sk-test"), oopt.WithMaxRetries(0))
	cc, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: *model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
		MaxTokens: openai.Int(16),
	})
	if err == nil && (len(cc.Choices) == 0 || cc.Choices[0].Message.Content == "" || cc.Usage.CompletionTokens == 0) {
		err = fmt.Errorf("empty answer: %+v", cc)
	}
	check("openai Chat.Completions.New", err)

	ostream := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: *model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Count to five.")},
		MaxTokens: openai.Int(16), StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var oacc openai.ChatCompletionAccumulator
	for ostream.Next() {
		oacc.AddChunk(ostream.Current())
	}
	err = ostream.Err()
	if err == nil && (len(oacc.Choices) == 0 || oacc.Choices[0].Message.Content == "" || oacc.Usage.CompletionTokens == 0) {
		err = fmt.Errorf("accumulated %+v", oacc.ChatCompletion)
	}
	check("openai Chat.Completions.NewStreaming + accumulator", err)

	_, err = oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var oerr *openai.Error
	switch {
	case err == nil:
		err = errors.New("no error for an unknown model")
	case !errors.As(err, &oerr):
		err = fmt.Errorf("not an *openai.Error: %T %v", err, err)
	case oerr.StatusCode != 404 || oerr.Message == "":
		err = fmt.Errorf("status %d message %q body %s", oerr.StatusCode, oerr.Message, oerr.RawJSON())
	default:
		err = nil
	}
	check("openai unknown model is a 404 the SDK parses, with a message", err)

	ml, err := oc.Models.List(ctx)
	if err == nil && len(ml.Data) == 0 {
		err = errors.New("no models")
	}
	check("openai Models.List", err)

	rs, err := oc.Responses.New(ctx, responsesParams(*model))
	if err == nil && rs.OutputText() == "" {
		err = fmt.Errorf("empty response: %s", rs.RawJSON())
	}
	check("openai Responses.New", err)

	rst := oc.Responses.NewStreaming(ctx, responsesParams(*model))
	text, done := "", false
	for rst.Next() {
		ev := rst.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			done = true
		}
	}
	err = rst.Err()
	if err == nil && (text == "" || !done) {
		err = fmt.Errorf("streamed %q, completed %v", text, done)
	}
	check("openai Responses.NewStreaming", err)

	if fails > 0 {
		fmt.Printf("%d failed\n", fails)
		os.Exit(1)
	}
}

func responsesParams(model string) responses.ResponseNewParams {
	return responses.ResponseNewParams{Model: model, Input: responses.ResponseNewParamsInputUnion{OfString: param.NewOpt("Say hello.")}}
}
