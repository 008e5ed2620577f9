"""What the frontend's series say about traffic: bursts, clumping, length spread, histograms, SLO attainment."""
