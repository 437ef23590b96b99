package mappingfile

import (
	"crypto/sha256"
	"os"
	"sync"

	"github.com/redpanda-data/benthos/v4/public/bloblang"
)

// CompileFile compiles the Bloblang file at path the way the mapping_file
// processor does (Compile, from the OS's files), for tools that show what a mapping makes of a message
// (`forwarder outbox show`, the console). A compiled mapping is kept with
// the content of every file it read, and compiled again only when one of
// them changed: a console page view reads the files but does not compile.
func CompileFile(path string) (*bloblang.Executor, error) {
	if exec := compiled.get(path); exec != nil {
		return exec, nil
	}
	m, watched, err := Compile(OSFiles{}, path)
	if err != nil {
		return nil, err
	}
	sums := make(map[string][sha256.Size]byte, len(watched))
	for name, st := range watched {
		sums[name] = st.sum
	}
	compiled.put(path, cachedMapping{exec: m.Exec, sums: sums})
	return m.Exec, nil
}

// maxCompiled bounds the mappings CompileFile keeps (one per api_type in
// practice); past it the cache starts again.
const maxCompiled = 64

var compiled = compiledFiles{byPath: map[string]cachedMapping{}}

type compiledFiles struct {
	mu     sync.Mutex
	byPath map[string]cachedMapping
}

type cachedMapping struct {
	exec *bloblang.Executor
	// sums is the content of every file the mapping was compiled from.
	sums map[string][sha256.Size]byte
}

// get returns the mapping compiled from path when none of its files
// changed since, nil otherwise.
func (c *compiledFiles) get(path string) *bloblang.Executor {
	c.mu.Lock()
	m, ok := c.byPath[path]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	for name, sum := range m.sums {
		content, err := os.ReadFile(name)
		if err != nil || sha256.Sum256(content) != sum {
			return nil
		}
	}
	return m.exec
}

func (c *compiledFiles) put(path string, m cachedMapping) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byPath) >= maxCompiled {
		clear(c.byPath)
	}
	c.byPath[path] = m
}
