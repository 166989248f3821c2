package checkpoint

// The node agent's wire types live in internal/nodeapi; these names stand
// for them here until the node agent's code moves to a package of its own
// and uses nodeapi's names directly.

import "github.com/model-orchestra/operator/internal/nodeapi"

type (
	Tier               = nodeapi.Tier
	Key                = nodeapi.Key
	Entry              = nodeapi.Entry
	Budgets            = nodeapi.Budgets
	ActionKind         = nodeapi.ActionKind
	Action             = nodeapi.Action
	DemoteSource       = nodeapi.DemoteSource
	Verification       = nodeapi.Verification
	PromoteRequest     = nodeapi.PromoteRequest
	DemoteRequest      = nodeapi.DemoteRequest
	DemoteResult       = nodeapi.DemoteResult
	TiersStatus        = nodeapi.TiersStatus
	WakeRecord         = nodeapi.WakeRecord
	SleepRecord        = nodeapi.SleepRecord
	NodeReport         = nodeapi.NodeReport
	VerificationReport = nodeapi.VerificationReport
	TierReport         = nodeapi.TierReport
	CRIUReport         = nodeapi.CRIUReport
	RuntimeReport      = nodeapi.RuntimeReport
	ColdReport         = nodeapi.ColdReport
	Bandwidth          = nodeapi.Bandwidth
	PromotionReport    = nodeapi.PromotionReport
	PredictedWake      = nodeapi.PredictedWake
	PromotionDone      = nodeapi.PromotionDone
	Prediction         = nodeapi.Prediction
	Promotion          = nodeapi.Promotion
	Deferred           = nodeapi.Deferred
)

const (
	TierHot           = nodeapi.TierHot
	TierWarm          = nodeapi.TierWarm
	TierCold          = nodeapi.TierCold
	Demote            = nodeapi.ActionDemote
	Drop              = nodeapi.ActionDrop
	DemoteFromStore   = nodeapi.DemoteFromStore
	DemoteFromEngine  = nodeapi.DemoteFromEngine
	DemoteWarmHeld    = nodeapi.DemoteWarmHeld
	ColdModelCache    = nodeapi.ColdModelCache
	ColdS3            = nodeapi.ColdS3
	PatternPeriodic   = nodeapi.PatternPeriodic
	PatternDaily      = nodeapi.PatternDaily
	PatternAfterSleep = nodeapi.PatternAfterSleep
)

// EngineOffloadName is nodeapi.EngineOffloadName.
func EngineOffloadName(name string) string { return nodeapi.EngineOffloadName(name) }
