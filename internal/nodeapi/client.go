package nodeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// The node agent's paths.
const (
	PathReport       = "/report"        // GET: the node's report
	PathTiers        = "/tiers"         // GET: budgets, use and copies; DELETE /tiers/<tier>/<ns>/<name>
	PathPromote      = "/promote"       // POST: copy an artifact into a tier
	PathDemote       = "/demote"        // POST: copy an engine's offload down a tier
	PathWakes        = "/wakes"         // POST: a wake record
	PathSleeps       = "/sleeps"        // POST: a sleep record
	PathVerify       = "/verify"        // POST: re-hash every copy now
	PathPromoteAhead = "/promote-ahead" // POST: promote the artifacts whose predicted wake is due
)

// Client is the client of one node agent. Every mutating call carries the
// release's caller token from Token (none when Token is empty).
type Client struct {
	// URL is the agent's base URL, e.g. http://10.0.0.5:9301.
	URL string
	// HTTP makes the calls; nil means http.DefaultClient. ctx bounds each.
	HTTP *http.Client
	// Token is the file of the release's caller token.
	Token TokenFile
}

// Call sends body as JSON (nil for none) to path and decodes a JSON
// answer into out (nil to discard it); a non-2xx answer is an error
// carrying the agent's message.
func (c Client) Call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.URL, "/")+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" && mutating(req) {
		tok, err := c.Token.Read()
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, req.URL.Path, err)
		}
		Authorize(req, tok)
	}
	client := c.HTTP
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, req.URL.Path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, req.URL.Path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		return fmt.Errorf("%s %s: %d: %s", method, req.URL.Path, resp.StatusCode, msg)
	}
	if out != nil && len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decoding the answer: %w", method, req.URL.Path, err)
		}
	}
	return nil
}
