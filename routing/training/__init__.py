"""Training core of the latency predictor: stored samples in, a publish decision out.

Pure: no I/O, no clock, no Prefect. The retrain flow fetches samples from the
routing service and calls, in order:

1. `data.prepare_samples`: per target (TTFT, TPOT), drop unusable samples with a
   counted reason, order the rest by recording time, and build the feature
   matrix with routing.features (the router's own serving-time function).
2. `fit.fit_target` on a time-ordered split (`split.time_split`): oldest samples train,
   the next slice calibrates, the most recent are held out. Models are
   scikit-learn HistGradientBoostingRegressor on log(latency): a point model
   (published in the format's "mean" slot; absolute error by default, so it
   predicts the median, which suits relative error better than the mean) and
   a p90 model (quantile loss, 0.9; quantiles survive the log).
   The p90 model is then calibrated on the calibration slice (`calibration`:
   conformalised quantile regression, one additive log offset, i.e. a factor, so that 90%
   of calibration latencies fall below it), which corrects the in-sample
   optimism of tree quantiles. A target may be relative: its models fit
   log(latency / the router's profile estimate) and the router multiplies
   back (`relative_to_estimate`: per target, the point model with the lower
   calibration MAPE); its p90 may then be "flat", the estimate times the
   calibration, when the trees do worse on the newer half of the calibration
   slice (`p90_select`).
3. `routing.training.export.to_document`: export to the routing service's safe JSON format (trees as
   node arrays, link "log"; nothing pickled).
4. `evaluation.evaluate_all`: the candidate, the currently published model and the profile
   estimate on the same held-out rows (`split.holdout_rows`: the most recent slice,
   with no endpoint holding more than `holdout_max_source_frac` of it, so a
   source of fabricated samples cannot decide the gate): MAPE of the mean prediction, p90
   coverage and relative p90 (pinball) loss, overall, per load bucket and per
   stratum (STRATA: queue depth, KV-cache use, prompt length).
5. `probe.probe_document`: the candidate's predictions over a probe grid of the
   feature ranges it may meet when serving (prompts up to the context length,
   deep queues, big batches, KV usage 0-1, every role); a non-finite, zero or
   absurd (above a ceiling) prediction anywhere on it refuses the model, even
   when forced. Held-out rows only cover the load the fleet happened to see.
6. `gate.decide_publish`: publish, refuse or skip, with the reason. Models are compared on
   MAPE of the point prediction and on the relative pinball loss of the p90
   (which rewards a calibrated p90, unlike coverage alone), on average and in
   every stratum with enough held-out rows.

Latencies are in ms throughout.
"""
