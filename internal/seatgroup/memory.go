package seatgroup

import (
	"context"
	"fmt"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// SidecarMemory is a MemoryReader over a sidecar's GET /state: the
// residentBytes and weightsBytes the engine reports (ErrMemoryNotReported
// when it does not).
type SidecarMemory struct{ sidecarapi.Client }

// ReadMemory implements MemoryReader.
func (s SidecarMemory) ReadMemory(ctx context.Context) (MemoryReading, error) {
	st, err := s.State(ctx)
	if err != nil {
		return MemoryReading{}, err
	}
	return ReadingOf(st)
}

// ReadingOf is the memory reading in a sidecar's status.
func ReadingOf(st sidecarapi.Status) (MemoryReading, error) {
	if st.WeightsError != "" {
		return MemoryReading{}, fmt.Errorf("the sidecar could not read the engine's memory: %s", st.WeightsError)
	}
	if st.ResidentBytes == nil {
		return MemoryReading{}, ErrMemoryNotReported
	}
	r := MemoryReading{ResidentBytes: *st.ResidentBytes}
	if st.WeightsBytes != nil {
		r.WeightsBytes = *st.WeightsBytes
	}
	return r, nil
}
