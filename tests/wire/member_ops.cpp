#include "member_ops.h"

#include <cstring>
#include <utility>

using namespace taiji;

namespace wire {

std::vector<uint8_t> bytes_of(const float* v, size_t n) {
  std::vector<uint8_t> out(n * sizeof(float));
  std::memcpy(out.data(), v, out.size());
  return out;
}

std::vector<uint8_t> theirs() { return bytes_of(kTheirs.data(), kTheirs.size()); }

std::string post_op(Peer& victim, FakeMember& fake, std::array<float, 2>* out,
                    std::shared_ptr<RequestState>* request, Frame* ready) {
  PostArgs a;
  a.name = kOp;
  a.send = kMine.data();
  a.recv = out->data();
  a.count = out->size();
  a.dtype = DType::F32;
  a.redop = RedOp::Sum;
  auto posted = victim.post(std::move(a));
  if (!posted.is_ok()) return "post: " + posted.status().message();
  *request = posted.value();
  Status s = fake.await(MsgType::Ready, kOp, (*request)->version(), after_ms(kBoundMs), ready);
  if (!s.is_ok()) return "no Ready from rank 0: " + s.message();
  return {};
}

std::string allreduce_checked(Peer& victim, FakeMember& fake, std::array<float, 2>* out,
                              const std::function<void(const Frame& ready)>& deliver,
                              std::shared_ptr<RequestState>* request) {
  Frame ready;
  std::string wrong = post_op(victim, fake, out, request, &ready);
  if (!wrong.empty()) return wrong;
  deliver(ready);
  Status s;
  if (!(*request)->wait_for(kBoundMs, &s)) return "the op did not end within 10 s";
  if (!s.is_ok()) return "allreduce failed: " + s.message();
  const std::array<float, 2> want = {kMine[0] + kTheirs[0], kMine[1] + kTheirs[1]};
  if (*out != want) return "wrong sum on rank 0";
  return {};
}

}  // namespace wire
