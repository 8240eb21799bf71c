// Package logging makes the slog handler whose JSON lines Cloud Logging
// reads as structured entries: message, severity and source location under
// the names it expects.
package logging

import (
	"io"
	"log/slog"
	"strconv"
)

// New returns a JSON logger for Cloud Logging writing to w.
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{
		AddSource: true,
		Level:     level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.MessageKey:
				a.Key = "message"
			case slog.LevelKey:
				a.Key = "severity"
				if l, ok := a.Value.Any().(slog.Level); ok {
					a.Value = slog.StringValue(severity(l))
				}
			case slog.SourceKey:
				// Only the handler's own source location: an attribute that
				// happens to be called "source" (a run's source) stays as it is.
				if s, ok := a.Value.Any().(*slog.Source); ok {
					a.Key = "logging.googleapis.com/sourceLocation"
					a.Value = slog.GroupValue(slog.String("file", s.File), slog.String("line", strconv.Itoa(s.Line)), slog.String("function", s.Function))
				}
			}
			return a
		},
	}))
}

func severity(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARNING"
	case l >= slog.LevelInfo:
		return "INFO"
	}
	return "DEBUG"
}
