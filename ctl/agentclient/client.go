package agentclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sockmesh/sockmesh/agent/explain"
	"github.com/sockmesh/sockmesh/agent/introspect"
	"github.com/sockmesh/sockmesh/agent/introspect/httpapi"
)

// Config says how to reach one agent: Socket, or Address with TLS and a
// token.
type Config struct {
	// Socket is the agent's unix socket; used when Address is empty.
	// Empty means httpapi.DefaultSocket.
	Socket string
	// Address is host:port of an agent's --introspection-listen.
	Address string
	// CAFile verifies the agent's certificate (empty: the system roots);
	// ServerName overrides the name verified (empty: Address's host).
	CAFile, ServerName string
	// TokenFile holds the bearer token Address requires.
	TokenFile string
	// Timeout bounds each request; zero means 30 s.
	Timeout time.Duration
}

// Client talks to one agent. It is safe for concurrent use.
type Client struct {
	http  *http.Client
	base  string
	token string
	// where names the agent in errors; absent says what to check when
	// nothing listens there.
	where, absent string
}

// New returns a Client for cfg. It reads the CA and token files now.
func New(cfg Config) (*Client, error) {
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	if cfg.Address == "" {
		socket := cfg.Socket
		if socket == "" {
			socket = httpapi.DefaultSocket
		}
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}}
		return &Client{http: &http.Client{Transport: tr, Timeout: timeout}, base: "http://agent", where: socket,
			absent: "is sockmesh running on this node? --agent-socket names another socket"}, nil
	}
	if cfg.TokenFile == "" {
		return nil, errors.New("an agent address needs a token file (--agent-token-file)")
	}
	token, err := os.ReadFile(cfg.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("read agent token: %w", err)
	}
	tc := &tls.Config{ServerName: cfg.ServerName, MinVersion: tls.VersionTLS13}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read agent CA: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("agent CA %s: no certificate", cfg.CAFile)
		}
	}
	tr := &http.Transport{TLSClientConfig: tc, Proxy: nil}
	return &Client{http: &http.Client{Transport: tr, Timeout: timeout}, base: "https://" + cfg.Address,
		token: strings.TrimSpace(string(token)), where: cfg.Address,
		absent: "does the agent there serve --introspection-listen on this port? --agent-address or --agent-port names another"}, nil
}

// Where names the agent (its socket or address).
func (c *Client) Where() string { return c.where }

// Status fetches the agent's status.
func (c *Client) Status(ctx context.Context) (introspect.Status, error) {
	var st introspect.Status
	return st, c.getJSON(ctx, httpapi.PathStatus, nil, &st)
}

// Explain asks the agent about q.
func (c *Client) Explain(ctx context.Context, q explain.Query) (explain.Explanation, error) {
	var e explain.Explanation
	return e, c.getJSON(ctx, httpapi.PathExplain, url.Values(httpapi.Values(q)), &e)
}

// Snapshot fetches the Snapshot the agent serves, keys redacted.
func (c *Client) Snapshot(ctx context.Context) (httpapi.SnapshotResponse, error) {
	var s httpapi.SnapshotResponse
	return s, c.getJSON(ctx, httpapi.PathSnapshot, nil, &s)
}

// Counters fetches the datapath's decision counters.
func (c *Client) Counters(ctx context.Context) (introspect.Counters, error) {
	var n introspect.Counters
	return n, c.getJSON(ctx, httpapi.PathCounters, nil, &n)
}

// Catalog lists the metrics the agent registered.
func (c *Client) Catalog(ctx context.Context) ([]introspect.MetricInfo, error) {
	var m []introspect.MetricInfo
	return m, c.getJSON(ctx, httpapi.PathCatalog, nil, &m)
}

// Metrics scrapes the agent's metrics.
func (c *Client) Metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	resp, err := c.get(ctx, httpapi.PathMetrics, nil, "text/plain;version=0.0.4")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("agent %s: parse metrics: %w", c.where, err)
	}
	return mfs, nil
}

func (c *Client) getJSON(ctx context.Context, path string, q url.Values, v any) error {
	resp, err := c.get(ctx, path, q, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("agent %s: decode %s: %w", c.where, path, err)
	}
	return nil
}

// get requests path and returns a 200 answer; anything else is an error
// carrying the agent's message.
func (c *Client) get(ctx context.Context, path string, q url.Values, accept string) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", c.where, err)
	}
	req.Header.Set("Accept", accept)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	switch {
	case errors.Is(err, syscall.EACCES):
		return nil, fmt.Errorf("agent %s: permission denied: the introspection socket serves root and the agent's group (run as root, e.g. with sudo)", c.where)
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ECONNREFUSED):
		return nil, fmt.Errorf("agent %s: no agent listening (%s): %w", c.where, c.absent, err)
	case err != nil:
		return nil, fmt.Errorf("agent %s: %w", c.where, err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e httpapi.ErrorResponse
	msg := strings.TrimSpace(string(body))
	switch {
	case json.Unmarshal(body, &e) == nil && e.Error != "":
		msg = e.Error
	case resp.StatusCode == http.StatusNotFound:
		// Only the router answers 404, in plain text: the path is unknown.
		msg = fmt.Sprintf("%s is not served here (an agent older than this sockmeshctl?)", path)
	}
	return nil, &StatusError{Code: resp.StatusCode, Agent: c.where, Message: msg}
}

// StatusError is an answer other than 200 from an agent.
type StatusError struct {
	Code    int
	Agent   string
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("agent %s: %s (HTTP %d)", e.Agent, e.Message, e.Code)
}
