
Bprobs_quantizedJ€‰¬€€€8€Š‚‚ ‹€€€G