package file

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/sockmesh/sockmesh/agent/source/manifests"
	"github.com/sockmesh/sockmesh/agent/translate"
)

// Config configures a Source.
type Config struct {
	// Dir is the directory of manifests. Required.
	Dir string
	// Debounce is how long after the first event of a burst the directory
	// is re-read, so that an editor's or kubectl's several writes make one
	// reload. Zero means 100ms.
	Debounce time.Duration
	// Resync is how often the directory is re-read without events, which
	// covers events the kernel dropped and a directory that was removed
	// and created again. Zero means one minute.
	Resync time.Duration
}

// Source reads and watches a directory of manifests.
type Source struct {
	cfg     Config
	log     *slog.Logger
	dec     *manifests.Decoder
	changed chan struct{}

	mu    sync.Mutex
	input translate.Input
	errs  []error

	// Owned by the goroutine running Run.
	files   map[string]*fileState
	digest  [sha256.Size]byte
	loaded  bool
	lastErr string
	// warned holds the deprecation warnings of the objects served at the
	// last reload, each logged once when it came (warnDeprecated).
	warned map[string]bool

	reloads *prometheus.CounterVec
	invalid prometheus.Gauge
	objects prometheus.Gauge
}

// fileState is what the source knows of one file.
type fileState struct {
	read bool
	sum  [sha256.Size]byte // of the bytes last read
	// objs came from the last content that parsed, goodSum is its hash,
	// warnings what an API server would warn of on its create.
	objs     []runtime.Object
	goodSum  [sha256.Size]byte
	warnings []manifests.Warning
	err      error // why the last read content is not used, or nil
	// emptied is when the file was first read empty while it had
	// objects (holdEmptied); zero when it is not empty.
	emptied time.Time
}

// New returns a Source for cfg.Dir. A nil reg registers no metrics.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Source, error) {
	if cfg.Dir == "" {
		return nil, errors.New("file source: Config.Dir is required")
	}
	cfg.Dir = filepath.Clean(cfg.Dir)
	if cfg.Debounce <= 0 {
		cfg.Debounce = 100 * time.Millisecond
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Minute
	}
	dec, err := manifests.NewDecoder()
	if err != nil {
		return nil, fmt.Errorf("file source: %w", err)
	}
	s := &Source{
		cfg:     cfg,
		log:     log.With("component", "file_source", "dir", cfg.Dir),
		dec:     dec,
		changed: make(chan struct{}, 1),
		files:   map[string]*fileState{},
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockmesh_source_file_reloads_total",
			Help: "Reads of the manifest directory, by result: ok, or error when a file or the directory could not be used.",
		}, []string{"result"}),
		invalid: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sockmesh_source_file_invalid_files",
			Help: "Manifest files whose current content is not used (their last good content is).",
		}),
		objects: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sockmesh_source_file_objects",
			Help: "Objects the file source currently serves.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{s.reloads, s.invalid, s.objects} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register file source metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Changed receives a value when Input changed (see source.Source); the
// first once the directory has been read.
func (s *Source) Changed() <-chan struct{} { return s.changed }

// Input returns the objects of the last read (see source.Source).
func (s *Source) Input() translate.Input {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.input
}

// Errors returns why files (or the directory) are not used as they are
// now, each naming the file; empty when everything was read.
func (s *Source) Errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.errs)
}

// Run watches the directory until ctx is done. It fails only when the
// directory cannot be watched at start.
func (s *Source) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", s.cfg.Dir, err)
	}
	defer w.Close()
	if err := w.Add(s.cfg.Dir); err != nil {
		return fmt.Errorf("watch %s: %w", s.cfg.Dir, err)
	}
	events := make(chan struct{}, 1)
	go func() {
		for {
			select {
			case _, ok := <-w.Events:
				if !ok {
					return
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				// An overflowed event queue loses events: re-read.
				s.log.Warn("watch error", "err", err)
			}
			select {
			case events <- struct{}{}:
			default:
			}
		}
	}()
	rewatch := func() {
		if slices.Contains(w.WatchList(), s.cfg.Dir) {
			return
		}
		// The directory was removed; watch it again once it is back.
		if err := w.Add(s.cfg.Dir); err == nil {
			s.log.Info("watching directory again")
		}
	}
	return s.loop(ctx, events, rewatch)
}

// loop reads the directory, then again Debounce after the first of a burst
// of events and every Resync, until ctx is done.
func (s *Source) loop(ctx context.Context, events <-chan struct{}, rewatch func()) error {
	s.reload()
	debounce := time.NewTimer(s.cfg.Debounce)
	debounce.Stop()
	defer debounce.Stop()
	resync := time.NewTicker(s.cfg.Resync)
	defer resync.Stop()
	pending := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-events:
			if !pending {
				pending = true
				debounce.Reset(s.cfg.Debounce)
			}
		case <-debounce.C:
			pending = false
			s.reload()
		case <-resync.C:
			if rewatch != nil {
				rewatch()
			}
			s.reload()
		}
	}
}

// reload reads every manifest file whose bytes changed, keeps the last
// good objects of files that do not parse, and publishes the result,
// signalling Changed when the objects changed.
func (s *Source) reload() {
	var errs []error
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		// Keep serving what was read before.
		errs = append(errs, fmt.Errorf("read directory %s: %w", s.cfg.Dir, err))
	} else {
		s.readFiles(entries)
	}

	var in translate.Input
	owner := map[string]string{}
	digest := sha256.New()
	count := 0
	invalid := 0
	for _, name := range slices.Sorted(maps.Keys(s.files)) {
		st := s.files[name]
		if st.err != nil {
			errs = append(errs, st.err)
			invalid++
		}
		if st.objs != nil {
			fmt.Fprintf(digest, "%s\x00%x\x00", name, st.goodSum)
		}
		for _, o := range st.objs {
			k := manifests.Key(o)
			if first, dup := owner[k]; dup {
				errs = append(errs, fmt.Errorf("%s: %s is already defined in %s; this definition is ignored", s.path(name), k, first))
				continue
			}
			owner[k] = name
			if err := manifests.Add(&in, o); err == nil {
				count++
			}
		}
	}
	clip(&in)
	s.warnDeprecated()
	var sum [sha256.Size]byte
	copy(sum[:], digest.Sum(nil))

	s.mu.Lock()
	s.input, s.errs = in, errs
	s.mu.Unlock()

	s.objects.Set(float64(count))
	s.invalid.Set(float64(invalid))
	result := "ok"
	if len(errs) > 0 {
		result = "error"
	}
	s.reloads.WithLabelValues(result).Inc()
	if msg := errors.Join(errs...); msg == nil && s.lastErr != "" {
		s.log.Info("manifest errors resolved")
		s.lastErr = ""
	} else if msg != nil && msg.Error() != s.lastErr {
		s.lastErr = msg.Error()
		s.log.Warn("manifests not used as they are; last good content kept", "err", msg)
	}
	if s.loaded && sum == s.digest {
		return
	}
	s.loaded, s.digest = true, sum
	s.log.Info("manifests loaded", "files", len(s.files), "objects", count)
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// readFiles updates s.files from the directory listing.
func (s *Source) readFiles(entries []os.DirEntry) {
	seen := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !isManifest(name) {
			continue
		}
		// Stat follows symlinks (a mounted ConfigMap's files are links); a
		// dangling link is no file, but one that cannot be followed (a
		// loop, a denied directory) is an error, not a removal.
		fi, err := os.Stat(s.path(name))
		if errors.Is(err, fs.ErrNotExist) || err == nil && !fi.Mode().IsRegular() {
			continue
		}
		seen[name] = true
		st := s.files[name]
		if st == nil {
			st = &fileState{}
			s.files[name] = st
		}
		if err != nil {
			st.unreadable(s.path(name), err)
			continue
		}
		s.readFile(s.path(name), st)
	}
	for name := range s.files {
		if !seen[name] {
			delete(s.files, name)
		}
	}
}

// readFile updates st from the file at path: its objects when its bytes
// changed and decode, else why not.
func (s *Source) readFile(path string, st *fileState) {
	data, err := readFile(path)
	if err != nil {
		st.unreadable(path, err)
		return
	}
	if s.holdEmptied(path, st, data) {
		return
	}
	sum := sha256.Sum256(data)
	if st.read && sum == st.sum {
		return
	}
	st.read, st.sum = true, sum
	objs, warnings, err := s.dec.DecodeWithWarnings(bytes.NewReader(data))
	if err != nil {
		st.err = fmt.Errorf("%s: %w", path, err)
		return
	}
	st.objs, st.goodSum, st.warnings, st.err = objs, sum, warnings, nil
}

// warnDeprecated logs, once for each, the objects served in a version
// their CRD deprecates (BackendTLSPolicy v1alpha3), as kubectl apply
// prints the API server's warning: read as the version to use, they
// serve, and the file would break when a release of the CRDs stops
// serving the version. An object is warned of again only after it was
// gone or in another version at a reload, not at each reread or resync.
func (s *Source) warnDeprecated() {
	warned := make(map[string]bool, len(s.warned))
	for name, st := range s.files {
		for _, w := range st.warnings {
			key := name + "\x00" + w.Object + "\x00" + w.APIVersion
			warned[key] = true
			if !s.warned[key] {
				s.log.Warn("object in a deprecated api version", "file", s.path(name), "object", w.Object,
					"api_version", w.APIVersion, "use", w.Use, "warning", w.Text)
			}
		}
	}
	s.warned = warned
}

// unreadable records that the file at path could not be read.
func (st *fileState) unreadable(path string, err error) {
	// What the file holds now is unknown: decode it again once it reads,
	// though its bytes be those last read.
	st.read = false
	st.err = fmt.Errorf("%s: %w", path, err)
}

// holdEmptied reports whether st keeps its objects though its file, data,
// is now empty: a shell's "> file" empties a file before its writer
// writes, and withdrawing the file's policies for that moment would send
// their connections without them. An emptied file is taken once it has
// stayed empty for Resync; removing it withdraws them at once.
func (s *Source) holdEmptied(path string, st *fileState, data []byte) bool {
	if len(data) > 0 || len(st.objs) == 0 {
		st.emptied = time.Time{}
		return false
	}
	now := time.Now()
	if st.emptied.IsZero() {
		st.emptied = now
	}
	if now.Sub(st.emptied) >= s.cfg.Resync {
		return false
	}
	st.read = false // look again at the next reload
	st.err = fmt.Errorf("%s: emptied: its objects stay until it has been empty for %v (remove it to withdraw them now)", path, s.cfg.Resync)
	return true
}

func (s *Source) path(name string) string { return filepath.Join(s.cfg.Dir, name) }

// maxFileBytes bounds a manifest file, so that a large file put in the
// directory by mistake (a log, a dump) is refused before it is read whole
// rather than exhausting the agent's memory: decoding allocates some 25
// times a file's size. A document may have manifests.MaxDocumentBytes.
const maxFileBytes = 32 << 20

// readFile reads the file at path, of at most maxFileBytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("over %d bytes: not read (split it into files)", maxFileBytes)
	}
	return data, nil
}

func isManifest(name string) bool {
	switch filepath.Ext(name) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// clip caps every list of in at its length, so a caller appending to one
// allocates instead of writing into an array the source shares.
func clip(in *translate.Input) {
	in.Services = slices.Clip(in.Services)
	in.EndpointSlices = slices.Clip(in.EndpointSlices)
	in.Namespaces = slices.Clip(in.Namespaces)
	in.Pods = slices.Clip(in.Pods)
	in.ConfigMaps = slices.Clip(in.ConfigMaps)
	in.Secrets = slices.Clip(in.Secrets)
	in.ClusterTrustBundles = slices.Clip(in.ClusterTrustBundles)
	in.BackendTLSPolicies = slices.Clip(in.BackendTLSPolicies)
	in.HTTPRoutes = slices.Clip(in.HTTPRoutes)
	in.GRPCRoutes = slices.Clip(in.GRPCRoutes)
	in.XBackends = slices.Clip(in.XBackends)
	in.XBackendTrafficPolicies = slices.Clip(in.XBackendTrafficPolicies)
	in.XMeshes = slices.Clip(in.XMeshes)
	in.ReferenceGrants = slices.Clip(in.ReferenceGrants)
}
