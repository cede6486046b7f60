package datapath

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/sockmesh/sockmesh/internal/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Main(m, map[string]func([]string) error{"load": loadHelper})
}

// loaderJob is what the "load" helper process does: what a restarted agent
// would do before exiting.
type loaderJob struct {
	Config   Config
	Cookie   uint64
	Proxy    Proxy
	Services []Service
}

// runLoader runs job in a loader process — another agent that opens the
// datapath, applies job and exits — and waits for it.
func runLoader(t *testing.T, job loaderJob) {
	t.Helper()
	b, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := sandbox.HelperCommand(t, "load", string(b))
	cmd.Stderr = &stderr
	if err := sandbox.Start(t, cmd, nil, nil).Wait(); err != nil {
		t.Fatalf("loader process: %v\n%s", err, stderr.String())
	}
}

// loadHelper runs in a child process: it loads (or adopts) the datapath,
// configures it, and exits, leaving only the pins behind.
func loadHelper(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want one JSON argument, got %d", len(args))
	}
	var job loaderJob
	if err := json.Unmarshal([]byte(args[0]), &job); err != nil {
		return err
	}
	d, err := Open(job.Config, nil, nil)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.SetServices(job.Services); err != nil {
		return err
	}
	if err := d.Enrol(job.Cookie, job.Proxy); err != nil {
		return err
	}
	return d.Heartbeat()
}
