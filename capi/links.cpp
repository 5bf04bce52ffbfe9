// The C ABI for links: measurement, matrices, and topologies computed from them.
#include <taiji/taiji.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "handles.h"
#include "runtime/link_measure.h"
#include "topology/link_optimizer.h"
#include "topology/selection.h"

using namespace taiji_capi;

struct taiji_link_matrix {
  taiji::LinkMatrix m;
};

namespace {

constexpr uint64_t kDefaultChunkBytes = uint64_t{1} << 20;

taiji_link_matrix_t* new_matrix(taiji::LinkMatrix m) { return new taiji_link_matrix{std::move(m)}; }

bool finite_non_negative(const double* values, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(values[i]) || values[i] < 0) return false;
  }
  return true;
}

double entry(const taiji_link_matrix_t* matrix, int src, int dst, bool bandwidth) {
  if (matrix == nullptr || src < 0 || dst < 0 || src >= matrix->m.n || dst >= matrix->m.n) return -1;
  return bandwidth ? matrix->m.bw(src, dst) : matrix->m.lat(src, dst);
}

// For the calls without a peer: taiji_peer_last_error(NULL) on this thread says why.
taiji_status_t refuse(const std::string& why) {
  init_error = why;
  return TAIJI_ERR_INVALID_ARGUMENT;
}

void copy_line(const std::string& line, char* buf, size_t len) {
  if (buf == nullptr || len == 0) return;
  const size_t n = std::min(line.size(), len - 1);
  std::memcpy(buf, line.data(), n);
  buf[n] = '\0';
}

}  // namespace

TAIJI_API taiji_status_t taiji_measure_links(taiji_peer_t* peer, const taiji_measure_options_t* options,
                                             taiji_link_matrix_t** matrix) {
  if (peer == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  if (matrix != nullptr) *matrix = nullptr;
  if (options != nullptr && options->struct_size < sizeof(taiji_measure_options_t)) {
    return invalid(peer, "measure options: struct_size is not from TAIJI_MEASURE_OPTIONS_INIT");
  }
  return guarded(peer, [&]() -> taiji_status_t {
    taiji::LinkMeasureOptions o;
    if (options != nullptr) {
      if (options->probe_bytes != 0) o.probe_bytes = options->probe_bytes;
      if (options->latency_rounds != 0) o.latency_rounds = options->latency_rounds;
      if (options->bandwidth_rounds != 0) o.bandwidth_rounds = options->bandwidth_rounds;
      o.timeout_ms = options->timeout_ms;
      o.background = options->background != 0;
    }
    auto measured = taiji::measure_links(*peer->impl, o);
    if (!measured.is_ok()) return record(peer, measured.status());
    if (matrix != nullptr) *matrix = new_matrix(std::move(measured.value()));
    return TAIJI_OK;
  });
}

TAIJI_API taiji_status_t taiji_peer_links(const taiji_peer_t* peer, taiji_link_matrix_t** matrix) {
  if (peer == nullptr || matrix == nullptr) return TAIJI_ERR_INVALID_ARGUMENT;
  *matrix = nullptr;
  try {
    auto links = peer->impl->links();
    if (links != nullptr) *matrix = new_matrix(*links);
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    return TAIJI_ERR_NO_MEMORY;
  }
}

TAIJI_API taiji_status_t taiji_link_matrix_create(int size, const double* bandwidth, const double* latency,
                                                  taiji_link_matrix_t** matrix) {
  if (matrix == nullptr) return refuse("link matrix output pointer is NULL");
  *matrix = nullptr;
  if (size < 1 || size > 65536) return refuse("link matrix size must be 1 to 65536, got " + std::to_string(size));
  if (bandwidth == nullptr) return refuse("link matrix bandwidth is NULL");
  const size_t count = static_cast<size_t>(size) * static_cast<size_t>(size);
  if (!finite_non_negative(bandwidth, count) || (latency != nullptr && !finite_non_negative(latency, count))) {
    return refuse("link matrix entries must be finite and not negative");
  }
  try {
    taiji::LinkMatrix m = taiji::LinkMatrix::sized(size);
    std::copy_n(bandwidth, count, m.bandwidth.begin());
    if (latency != nullptr) std::copy_n(latency, count, m.latency.begin());
    for (int r = 0; r < size; ++r) {
      m.bandwidth[m.index(r, r)] = 0;
      m.latency[m.index(r, r)] = 0;
    }
    *matrix = new_matrix(std::move(m));
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    return TAIJI_ERR_NO_MEMORY;
  }
}

TAIJI_API int taiji_link_matrix_size(const taiji_link_matrix_t* matrix) { return matrix ? matrix->m.n : 0; }

TAIJI_API double taiji_link_bandwidth(const taiji_link_matrix_t* matrix, int src, int dst) {
  return entry(matrix, src, dst, true);
}

TAIJI_API double taiji_link_latency(const taiji_link_matrix_t* matrix, int src, int dst) {
  return entry(matrix, src, dst, false);
}

TAIJI_API void taiji_link_matrix_destroy(taiji_link_matrix_t* matrix) { delete matrix; }

TAIJI_API taiji_status_t taiji_optimize_topology(const taiji_peer_t* peer, const taiji_link_matrix_t* matrix,
                                                 const taiji_optimize_options_t* options,
                                                 taiji_topology_t** topology, char* explanation, size_t len) {
  copy_line("", explanation, len);
  if (topology == nullptr) return refuse("topology output pointer is NULL");
  *topology = nullptr;
  if (matrix == nullptr) return refuse("link matrix is NULL");
  if (options != nullptr && options->struct_size < sizeof(taiji_optimize_options_t)) {
    return refuse("optimize options: struct_size is not from TAIJI_OPTIMIZE_OPTIONS_INIT");
  }
  if (peer != nullptr && peer->impl->size() != matrix->m.n) {
    const std::string why = "the matrix has " + std::to_string(matrix->m.n) + " ranks, the peer's job " +
                            std::to_string(peer->impl->size());
    copy_line(why, explanation, len);
    return refuse(why);
  }
  try {
    taiji::OptimizeOptions o;
    if (peer != nullptr && peer->impl->config().chunk_bytes != 0) o.chunk_bytes = peer->impl->config().chunk_bytes;
    if (options != nullptr && options->bytes != 0) o.bytes = options->bytes;
    if (options != nullptr && options->chunk_bytes != 0) o.chunk_bytes = options->chunk_bytes;
    auto result = taiji::optimize_topology(matrix->m, o);
    if (!result.is_ok()) {
      copy_line(result.status().message(), explanation, len);
      init_error = result.status().message();
      return to_c(result.status());
    }
    copy_line(result.value().explanation, explanation, len);
    auto t = std::make_unique<taiji_topology>();
    t->size = matrix->m.n;
    t->bound = taiji::bind_custom(std::move(result.value().strategy));
    *topology = t.release();
    return TAIJI_OK;
  } catch (const std::bad_alloc&) {
    return TAIJI_ERR_NO_MEMORY;
  }
}

TAIJI_API double taiji_predict_allreduce(const taiji_topology_t* topology, const taiji_link_matrix_t* matrix,
                                         uint64_t bytes) {
  if (topology == nullptr || matrix == nullptr || topology->size != matrix->m.n) return -1;
  if (topology->bound.strategy == nullptr) return -1;
  return taiji::predict_allreduce(*topology->bound.strategy, matrix->m, bytes, kDefaultChunkBytes).seconds;
}
