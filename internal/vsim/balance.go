package vsim

// Balance counts, at each telemetry scrape, whether some worker ran two
// or more requests (running or queued in the engine), over 1.5× the
// fleet's mean load, while another sat idle: herding, the failure
// affinity must not cause. One request on one card of an otherwise idle
// fleet is not herding, so a worker must hold two.
type Balance struct {
	// Scrapes is the number of scrapes with any load.
	Scrapes int
	// Herded is the number of those where a worker was over 1.5× the
	// mean while another had nothing; WorstRatio the highest such ratio
	// of the busiest worker's load to the mean (0 when never).
	Herded     int
	WorstRatio float64
}

// observeBalance adds one scrape's loads to b.
func (b *Balance) observe(loads []int) {
	sum, most, idle := 0, 0, false
	for _, l := range loads {
		sum += l
		most = max(most, l)
		idle = idle || l == 0
	}
	if sum == 0 {
		return
	}
	b.Scrapes++
	mean := float64(sum) / float64(len(loads))
	if ratio := float64(most) / mean; idle && most >= 2 && ratio > 1.5 {
		b.Herded++
		b.WorstRatio = max(b.WorstRatio, ratio)
	}
}
