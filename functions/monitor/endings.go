package monitor

import (
	"fmt"
	"strings"

	"github.com/raydrop/raydrop/pkg/runs"
)

func cancel(msg string, deleteJob bool) Decision {
	return Decision{Action: Finish, DeleteJob: deleteJob, Ending: runs.Ending{Outcome: runs.OutcomeCancelled, Reason: runs.ReasonCancelled, Message: msg}}
}

func fail(reason runs.Reason, deleteJob bool, format string, args ...any) Decision {
	return Decision{Action: Finish, DeleteJob: deleteJob, Ending: runs.Ending{Outcome: runs.OutcomeFailed, Reason: reason, Message: fmt.Sprintf(format, args...)}}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 500 {
		s = s[:500] + "…"
	}
	return s
}
