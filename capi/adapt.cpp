// The C ABI for adaptation: the engine handle, built-in and callback policies, the step.
#include <taiji/taiji.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "adapt/policies.h"
#include "handles.h"
#include "runtime/adapt_step.h"

using namespace taiji_capi;

struct taiji_adapt {
  taiji_peer_t* peer = nullptr;
  taiji::Engine engine;
  taiji_grad_stats_t* stats = nullptr;
  std::map<std::string, double> inputs;
  // The last step's actions: the strings handed out point into them.
  std::vector<taiji::Action> last;
};

struct taiji_action_list {
  std::vector<taiji::Action>* out = nullptr;
};

namespace {

// A policy written by the user, called with a C view of the engine's.
class CallbackPolicy final : public taiji::Policy {
 public:
  CallbackPolicy(taiji_adapt_policy_fn fn, void* user) : fn_(fn), user_(user) {}
  std::string name() const override { return "callback"; }
  taiji::Status on_step(const taiji::StepView& v, std::vector<taiji::Action>* actions) override {
    const taiji::StepTable& t = *v.table;
    std::vector<unsigned char> stragglers(v.stragglers.begin(), v.stragglers.end());
    std::vector<const char*> keys;
    std::vector<double> inputs;
    for (size_t k = 0; k < t.input_keys.size(); ++k) {
      keys.push_back(t.input_keys[k].c_str());
      inputs.insert(inputs.end(), t.inputs[k].begin(), t.inputs[k].end());
    }
    taiji_step_view_t view{};
    view.struct_size = sizeof(view);
    view.step = t.step;
    view.size = t.size;
    view.requested_size = t.requested_size;
    view.step_seconds = t.step_seconds.data();
    view.samples = t.samples.data();
    view.link_bytes_per_second = t.link_bytes_per_second.data();
    view.stragglers = stragglers.data();
    view.median_seconds = v.median_seconds;
    view.throughput = v.throughput;
    view.noise_scale = t.noise_scale;
    view.snr = t.snr;
    view.sync_mode = static_cast<int>(t.sync_mode);
    view.total_samples = v.total_samples;
    view.n_inputs = keys.size();
    view.input_keys = keys.data();
    view.inputs = inputs.data();
    taiji_action_list list{actions};
    const taiji_status_t s = fn_(&view, &list, user_);
    if (s != TAIJI_OK) {
      // A positive status is no error code; the step still fails, as an internal error.
      const taiji::Code code = s < 0 ? static_cast<taiji::Code>(s) : taiji::Code::Internal;
      return {code, std::string("callback returned ") + taiji_status_name(s)};
    }
    return {};
  }

 private:
  taiji_adapt_policy_fn fn_;
  void* user_;
};

bool valid_mode(int mode) { return mode >= 0 && mode < taiji::kSyncModeCount; }

}  // namespace

extern "C" {

const char* taiji_sync_mode_name(int mode) {
  return valid_mode(mode) ? taiji::sync_mode_name(static_cast<taiji::SyncMode>(mode)) : "";
}

const char* taiji_action_kind_name(int kind) {
  return kind >= 0 && kind < taiji::kActionKindCount ? taiji::action_kind_name(static_cast<taiji::ActionKind>(kind))
                                                     : "";
}

taiji_status_t taiji_adapt_create(taiji_peer_t* peer, taiji_adapt_t** engine) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (engine == nullptr) return invalid(peer, "engine output is NULL");
  *engine = nullptr;
  return guarded(peer, [&] {
    *engine = new taiji_adapt;
    (*engine)->peer = peer;
    return TAIJI_OK;
  });
}

void taiji_adapt_destroy(taiji_adapt_t* engine) { delete engine; }

taiji_status_t taiji_adapt_add_policy(taiji_adapt_t* engine, const char* spec) {
  if (engine == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  taiji_peer_t* peer = engine->peer;
  if (spec == nullptr) return invalid(peer, "spec is NULL");
  return guarded(peer, [&] {
    auto made = taiji::make_policy(spec);
    if (!made.is_ok()) return record(peer, made.status());
    engine->engine.add(std::move(made.value()));
    return TAIJI_OK;
  });
}

taiji_status_t taiji_adapt_add_callback(taiji_adapt_t* engine, taiji_adapt_policy_fn fn, void* user_data) {
  if (engine == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (fn == nullptr) return invalid(engine->peer, "fn is NULL");
  return guarded(engine->peer, [&] {
    engine->engine.add(std::make_unique<CallbackPolicy>(fn, user_data));
    return TAIJI_OK;
  });
}

taiji_status_t taiji_action_list_add(taiji_action_list_t* actions, const taiji_action_t* action) {
  if (actions == nullptr || action == nullptr || action->struct_size < sizeof(size_t) ||
      action->struct_size > (1u << 16)) {
    return TAIJI_ERR_INVALID_ARGUMENT;
  }
  try {
    taiji_action_t a = TAIJI_ACTION_INIT;
    std::memcpy(&a, action, std::min(action->struct_size, sizeof(a)));
    if (a.kind < 0 || a.kind >= taiji::kActionKindCount) return TAIJI_ERR_INVALID_ARGUMENT;
    if (a.kind == TAIJI_ACTION_SET_SYNC_MODE && !valid_mode(a.mode)) return TAIJI_ERR_INVALID_ARGUMENT;
    if (a.kind == TAIJI_ACTION_SET_TOPOLOGY && (a.topology == nullptr || *a.topology == '\0')) {
      return TAIJI_ERR_INVALID_ARGUMENT;
    }
    taiji::Action out;
    out.kind = static_cast<taiji::ActionKind>(a.kind);
    out.mode = valid_mode(a.mode) ? static_cast<taiji::SyncMode>(a.mode) : taiji::SyncMode::Bsp;
    out.size = a.size;
    if (a.topology != nullptr) out.topology = a.topology;
    out.batch_scale = a.batch_scale;
    out.lr_scale = a.lr_scale;
    if (a.reason != nullptr) out.reason = a.reason;
    actions->out->push_back(std::move(out));
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    return TAIJI_ERR_NO_MEMORY;
  }
}

taiji_status_t taiji_adapt_set_grad_stats(taiji_adapt_t* engine, taiji_grad_stats_t* stats) {
  if (engine == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (stats != nullptr && grad_stats_peer(stats) != engine->peer) {
    return invalid(engine->peer, "stats were created for another peer");
  }
  engine->stats = stats;
  return TAIJI_OK;
}

taiji_status_t taiji_adapt_set_input(taiji_adapt_t* engine, const char* key, double value) {
  if (engine == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  taiji_peer_t* peer = engine->peer;
  if (key == nullptr || *key == '\0') return invalid(peer, "key is NULL or empty");
  if (!std::isfinite(value)) return invalid(peer, "value is not finite");
  return guarded(peer, [&] {
    if (engine->inputs.count(key) == 0 && engine->inputs.size() >= taiji::kMaxAdaptInputs) {
      return invalid(peer, "more than 16 custom inputs for one step");
    }
    engine->inputs[key] = value;
    return TAIJI_OK;
  });
}

taiji_status_t taiji_adapt_set_sync_mode(taiji_adapt_t* engine, int mode) {
  if (engine == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (!valid_mode(mode)) return invalid(engine->peer, "mode is not a taiji_sync_mode_t");
  engine->engine.set_sync_mode(static_cast<taiji::SyncMode>(mode));
  return TAIJI_OK;
}

int taiji_adapt_sync_mode(const taiji_adapt_t* engine) {
  return engine == nullptr ? -1 : static_cast<int>(engine->engine.sync_mode());
}

taiji_status_t taiji_adapt_reset(taiji_adapt_t* engine) {
  if (engine == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  return guarded(engine->peer, [&] {
    engine->engine.reset();
    return TAIJI_OK;
  });
}

taiji_status_t taiji_adapt_step(taiji_adapt_t* engine, double samples, int64_t timeout_ms,
                                taiji_action_t* actions, size_t max_actions, size_t* n_actions) {
  if (engine == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  taiji_peer_t* peer = engine->peer;
  if (n_actions == nullptr) return invalid(peer, "n_actions is NULL");
  *n_actions = 0;
  if (actions == nullptr && max_actions > 0) return invalid(peer, "actions is NULL");
  const size_t stride = max_actions > 0 ? actions[0].struct_size : 0;
  if (max_actions > 0 && (stride < sizeof(size_t) || stride > (1u << 16))) {
    return invalid(peer, "actions[0].struct_size is not set (use TAIJI_ACTION_INIT)");
  }
  if (!(samples >= 0) || !std::isfinite(samples)) return invalid(peer, "samples must be finite and >= 0");
  if (timeout_ms < 0) return invalid(peer, "timeout_ms is negative");
  return guarded(peer, [&] {
    taiji::AdaptRecordInputs in;
    in.samples = samples;
    in.inputs.swap(engine->inputs);
    if (engine->stats != nullptr) {
      taiji_grad_stats_result_t r = TAIJI_GRAD_STATS_RESULT_INIT;
      if (taiji_grad_stats_read(engine->stats, &r) == TAIJI_OK && r.state == TAIJI_GRAD_STATS_DEFINED) {
        in.have_grad_stats = std::isfinite(r.noise_scale) && std::isfinite(r.snr);
        in.noise_scale = r.noise_scale;
        in.snr = r.snr;
      }
    }
    taiji::Peer& impl = *peer->impl;
    // Read only when a policy needs it: it costs rank 0 a store round trip.
    if (impl.rank() == 0 && engine->engine.wants_requested_size(engine->engine.steps())) {
      in.requested_size = peer->elastic->requested_size(impl);
    }
    const taiji::Status s = taiji::adapt_step(impl, engine->engine, in, timeout_ms, nullptr, &engine->last);
    auto* base = reinterpret_cast<unsigned char*>(actions);
    for (size_t i = 0; i < engine->last.size() && i < max_actions; ++i) {
      const taiji::Action& a = engine->last[i];
      taiji_action_t c = TAIJI_ACTION_INIT;
      c.kind = static_cast<int>(a.kind);
      c.mode = static_cast<int>(a.mode);
      c.size = a.size;
      c.topology = a.topology.c_str();
      c.batch_scale = a.batch_scale;
      c.lr_scale = a.lr_scale;
      c.policy = a.policy.c_str();
      c.reason = a.reason.c_str();
      c.applied = a.applied ? 1 : 0;
      std::memcpy(base + i * stride, &c, std::min(stride, sizeof(c)));
      reinterpret_cast<taiji_action_t*>(base + i * stride)->struct_size = std::min(stride, sizeof(c));
    }
    *n_actions = engine->last.size();
    return record(peer, s);
  });
}

taiji_status_t taiji_adapt_find_bsp_fraction(const double* fractions, const double* accuracies, size_t n,
                                             double bsp_accuracy, double tolerance, double resolution,
                                             double* fraction, int* done) {
  if (fraction == nullptr || done == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (n > 0 && (fractions == nullptr || accuracies == nullptr)) return TAIJI_ERR_INVALID_ARGUMENT;
  if (!(resolution > 0 && resolution <= 1)) return TAIJI_ERR_INVALID_ARGUMENT;
  try {
    const taiji::FractionSearch r =
        taiji::find_bsp_fraction(std::vector<double>(fractions, fractions + n),
                                 std::vector<double>(accuracies, accuracies + n), bsp_accuracy, tolerance,
                                 resolution);
    *fraction = r.fraction;
    *done = r.done ? 1 : 0;
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    return TAIJI_ERR_NO_MEMORY;
  }
}

}  // extern "C"
