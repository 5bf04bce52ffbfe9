// Where a job's memberships meet in the rendezvous store (embedded or etcd): each
// membership's addresses, and the keys through which the ranks, the launchers and an
// operator coordinate resizes. docs/elastic.md lists them for operators.
#pragma once

#include <cstdint>
#include <string>

namespace taiji {

// "<job>/addr/" for the first membership (where it always was), "<job>/v<N>/addr/" for
// each later one, so that a resize never reads a former member's address.
inline std::string rendezvous_prefix(const std::string& job_id, uint32_t version) {
  return version <= 1 ? job_id + "/addr/" : job_id + "/v" + std::to_string(version) + "/addr/";
}
// "<version> <size>": the membership now starting; launchers start the ranks it adds.
inline std::string elastic_cluster_key(const std::string& job_id) { return job_id + "/elastic/cluster"; }
// A size asked for from outside, as decimal text; "0" or absent: none.
inline std::string elastic_request_key(const std::string& job_id) { return job_id + "/elastic/request"; }
// "<min> <max>": the sizes the launcher accepts.
inline std::string elastic_limits_key(const std::string& job_id) { return job_id + "/elastic/limits"; }
// Round `round` of the shrinks of membership `version`: "open R..." while survivors join,
// "closed T R..." once agreed (T: the new membership's version; R: old ranks, ascending).
inline std::string elastic_shrink_key(const std::string& job_id, uint32_t version, uint32_t round) {
  return job_id + "/v" + std::to_string(version) + "/shrink/" + std::to_string(round);
}

}  // namespace taiji
