package mapping

import "github.com/redpanda-data/benthos/v4/public/bloblang"

// CompileFile compiles the Bloblang file at path the way the mapping_file
// processor does (global environment, so percent_round and
// ts_format_platform are there; imports resolved against the importing
// file's directory), for tools that show what a mapping makes of a message
// (`forwarder outbox show`, the console).
func CompileFile(path string) (*bloblang.Executor, error) {
	m, _, err := compileMappingFile(osFiles{}, path)
	if err != nil {
		return nil, err
	}
	return m.exec, nil
}

// ErrorReason returns the reason of a mapping error as the pipeline records
// it (after "mapping: "), without Bloblang's structural prefixes.
func ErrorReason(err error) string { return mappingErrorReason(err) }
