package lifecycle

// The status of a seat group's members: each member's lifecycle status,
// worked out from its sidecars' last readings and its demand, and written
// once after each step of a group pod's executor (writeStatus), to the
// bucket and the group StatefulSet's annotation for the member.

import (
	"context"
	"strconv"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// writeStatus publishes each member's lifecycle status (the bucket and the
// group StatefulSet's SeatAnnotationStatus annotation): at once when its
// seat changed or it started or stopped waiting for one, and its waiting
// time otherwise at most once a minute. A failed write is retried after
// the next step.
func (r *seatGroupRun) writeStatus(ctx context.Context) {
	for _, m := range r.members {
		force := r.memberStatus(m)
		if err := r.c.persist(ctx, &m.statusRecord, force); err != nil && ctx.Err() == nil {
			r.c.log.Warn("seat group: publishing status; retrying", "seatGroup", r.g.Name, "app", m.cfg.Name, "err", err)
		}
	}
}

// groupSeatState is an application's state across the pods of its group,
// from the sidecars' readings (ok false: not read): Awake when one pod has it
// awake, else Waking, else Draining, else Asleep once every pod was read
// and has it asleep; "" when that cannot be told.
func groupSeatState(readings []sidecarapi.Status, ok []bool) v1alpha1.LifecycleState {
	rank := map[sidecarapi.State]v1alpha1.LifecycleState{
		sidecarapi.Awake: v1alpha1.LifecycleAwake, sidecarapi.Waking: v1alpha1.LifecycleWaking,
		sidecarapi.Draining: v1alpha1.LifecycleDraining, sidecarapi.FallingAsleep: v1alpha1.LifecycleDraining,
	}
	for _, want := range []v1alpha1.LifecycleState{v1alpha1.LifecycleAwake, v1alpha1.LifecycleWaking, v1alpha1.LifecycleDraining} {
		for i, st := range readings {
			if ok[i] && rank[st.State] == want {
				return want
			}
		}
	}
	if len(readings) == 0 {
		return ""
	}
	for i, st := range readings {
		if !ok[i] || st.State != sidecarapi.Asleep {
			return ""
		}
	}
	return v1alpha1.LifecycleAsleep
}

// memberStatus fills m's status from the last readings; it reports
// whether anything but the waiting time changed.
func (r *seatGroupRun) memberStatus(m *seatMember) bool {
	dm, swaps, lastSwap := m.demand, m.swaps, m.lastSwap
	var readings []sidecarapi.Status
	var oks []bool
	var holding []string
	for _, p := range r.pods {
		st, ok := p.sidecars[m.cfg.Name].reading()
		readings, oks = append(readings, st), append(oks, ok)
		if ok && holdsAccelerator(st.State) {
			holding = append(holding, p.name)
		}
	}
	st := &m.status
	before := *st
	var prevSeat v1alpha1.SeatStatus
	if st.Seat != nil {
		prevSeat = *st.Seat
	}
	now := r.c.now()
	if state := groupSeatState(readings, oks); state != "" && st.State != state {
		st.State, st.Since = state, &metav1.Time{Time: now}
	}
	st.Replicas = int32(len(r.pods))
	st.ResidentTier = seatMemberTier(st.State, m.cfg.SleepLevel, m.cfg.Level1Tier)
	if t := copiesTier(readings, oks); m.cfg.ModelCopies && st.State == v1alpha1.LifecycleAsleep && t != "" {
		// Its sidecars say which copy the next wake reads (at any level).
		st.ResidentTier = t
	}
	if !dm.LastUse.IsZero() {
		st.LastActiveTime = &metav1.Time{Time: dm.LastUse}
	}
	s := v1alpha1.SeatStatus{Holding: len(holding) > 0, Pods: holding, SwapsIn: swaps}
	if lastSwap > 0 {
		s.LastSwapSeconds = strconv.FormatFloat(lastSwap, 'f', 3, 64)
	}
	if dm.Queued > 0 && !s.Holding {
		s.WaitingSeconds = strconv.FormatFloat(dm.OldestWait.Seconds(), 'f', 1, 64)
	}
	st.Seat = &s
	// The wait's seconds alone do not force a write; its start and end do.
	cmpPrev, cmpNow := prevSeat, s
	cmpPrev.WaitingSeconds, cmpNow.WaitingSeconds = "", ""
	waitChanged := (prevSeat.WaitingSeconds == "") != (s.WaitingSeconds == "")
	return before.State != st.State || before.ResidentTier != st.ResidentTier || !equality.Semantic.DeepEqual(cmpPrev, cmpNow) || waitChanged
}

// seatMemberTier is where a seat-group member's weights rest: on the
// accelerator while it holds its seat; after a level-1 sleep where its
// engine leaves them (restingTier's rule: the hot tier for an engine's own
// offload, the cold tier for engines that unload completely, Ollama and
// llama.cpp); unknown after a level-2 sleep or before the sidecars
// answered.
func seatMemberTier(state v1alpha1.LifecycleState, level int32, level1 v1alpha1.Tier) v1alpha1.Tier {
	switch {
	case state == v1alpha1.LifecycleAwake || state == v1alpha1.LifecycleDraining:
		return v1alpha1.TierAccelerator
	case state == v1alpha1.LifecycleAsleep && level <= 1:
		return restingTier(1, level1, false, nil)
	}
	return ""
}

// copiesTier is the slowest tier the asleep sidecars of a member that
// loads copies say their next wake reads (GET /state's model), or "" when
// none says.
func copiesTier(readings []sidecarapi.Status, oks []bool) v1alpha1.Tier {
	var tier v1alpha1.Tier
	for i, st := range readings {
		if !oks[i] || st.State != sidecarapi.Asleep || st.Model == nil {
			continue
		}
		if t := st.Model.Tier; t != "" && (tier == "" || t.SlowerThan(tier)) {
			tier = t
		}
	}
	return tier
}
