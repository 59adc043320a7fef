package admissionbench

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// arrival is one request of the trace: at its offset from the start, for a
// customer (an index), of a cost in units.
type arrival struct {
	at       time.Duration
	customer int32
	cost     int64
}

// trace is the demand of one run, per gateway in time order.
type trace struct {
	gateways [][]arrival
	demand   []int64 // units offered per customer over the whole trace
	requests int64
	// firsts counts the requests that are their customer's first at their
	// gateway, and firstsSteady those of them after the warm-up
	// (Options.warmUp), of steady requests.
	firsts, firstsSteady, steady int64
}

// slot is the granularity of the burst model.
const slot = 100 * time.Millisecond

// newTrace draws the demand: customer i (0-based) gets a share of Rate
// proportional to 1/(i+1)^Skew; its rate alternates between bursts (Burst ×
// its mean, a fifth of the time on average, half a second long on average)
// and quiet spells (low enough that the mean is kept); arrivals within a
// slot are Poisson and go to a gateway chosen uniformly, as behind a load
// balancer.
func newTrace(o Options) trace {
	rng := rand.New(rand.NewPCG(o.Seed, 0x7a11))
	weights := make([]float64, o.Customers)
	var sum float64
	for i := range weights {
		weights[i] = 1 / math.Pow(float64(i+1), o.Skew)
		sum += weights[i]
	}
	const onShare, leaveBurst = 0.2, 0.2 // per slot: stay in a burst 5 slots on average
	enterBurst := leaveBurst * onShare / (1 - onShare)
	quiet := (1 - onShare*o.Burst) / (1 - onShare)
	t := trace{gateways: make([][]arrival, o.Gateways), demand: make([]int64, o.Customers)}
	slots := int(o.Duration / slot)
	for c := range o.Customers {
		mean := float64(o.Rate) * weights[c] / sum * slot.Seconds()
		bursting := rng.Float64() < onShare
		for s := range slots {
			m := quiet
			if bursting {
				m = o.Burst
			}
			for range poisson(rng, mean*m) {
				a := arrival{at: time.Duration(s)*slot + time.Duration(rng.Int64N(int64(slot))), customer: int32(c), cost: 1}
				g := rng.IntN(o.Gateways)
				t.gateways[g] = append(t.gateways[g], a)
				t.demand[c] += a.cost
				t.requests++
			}
			if bursting {
				bursting = rng.Float64() >= leaveBurst
			} else {
				bursting = rng.Float64() < enterBurst
			}
		}
	}
	warm := o.warmUp()
	for _, g := range t.gateways {
		slices.SortFunc(g, func(a, b arrival) int { return int(a.at - b.at) })
		seen := make([]bool, o.Customers)
		for _, a := range g {
			steady := a.at >= warm
			if steady {
				t.steady++
			}
			if !seen[a.customer] {
				seen[a.customer] = true
				t.firsts++
				if steady {
					t.firstsSteady++
				}
			}
		}
	}
	return t
}

// poisson draws from a Poisson distribution of mean lambda (Knuth's method
// below 30, a rounded normal above: the trace needs shape, not exactness).
func poisson(rng *rand.Rand, lambda float64) int {
	if lambda <= 0 {
		return 0
	}
	if lambda > 30 {
		return max(0, int(math.Round(lambda+math.Sqrt(lambda)*rng.NormFloat64())))
	}
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}
