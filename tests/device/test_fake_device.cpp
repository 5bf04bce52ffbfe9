// The fake device runtime on its own, driven from one thread: its comms never block but in
// finalize(). What it computes is checked against values worked out here, exactly.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "../support/fake_device.h"

using taiji::Code;
using taiji::DeviceComm;
using taiji::DeviceOp;
using taiji::DType;
using taiji::OpKind;
using taiji::RedOp;
using taiji::Status;
using taiji_test::FakeDeviceRuntime;
using taiji_test::LaunchedOp;

namespace {

using Comms = std::vector<std::unique_ptr<DeviceComm>>;

Comms join_all(FakeDeviceRuntime& fake, int n) {
  std::string id = fake.make_id().value();
  Comms comms;
  for (int r = 0; r < n; ++r) {
    auto c = fake.create_comm(id, r, n, 0);
    REQUIRE(c.is_ok());
    comms.push_back(std::move(c.value()));
  }
  for (auto& c : comms) REQUIRE(c->init_status().is_ok());
  return comms;
}

// Whether `batch` completes within `ms`.
bool completes(DeviceComm& c, uint64_t batch, int ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    auto d = c.done(batch);
    if (d.is_ok() && d.value()) return true;
    if (!d.is_ok() || std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

uint64_t launch(DeviceComm& c, const DeviceOp& op) {
  auto b = c.launch({op});
  REQUIRE(b.is_ok());
  return b.value();
}

template <typename T>
T input(int rank, size_t i) {
  return static_cast<T>(rank + 1 + static_cast<int>(i % 4));
}

template <typename T>
T fold(RedOp op, int n, size_t i) {
  T acc = input<T>(0, i);
  for (int r = 1; r < n; ++r) {
    T v = input<T>(r, i);
    switch (op) {
      case RedOp::Sum:
      case RedOp::Avg:
        acc = static_cast<T>(acc + v);
        break;
      case RedOp::Prod:
        acc = static_cast<T>(acc * v);
        break;
      case RedOp::Min:
        acc = std::min(acc, v);
        break;
      case RedOp::Max:
        acc = std::max(acc, v);
        break;
    }
  }
  return op == RedOp::Avg ? static_cast<T>(acc / static_cast<T>(n)) : acc;
}

// Every kind with every operator that applies, one batch each, on `n` ranks.
template <typename T>
void check_results(DType dtype, int n) {
  FakeDeviceRuntime fake;
  Comms comms = join_all(fake, n);
  const size_t count = 9;
  const T sentinel = static_cast<T>(99);
  std::vector<RedOp> redops = {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max};
  if (taiji::dtype_is_float(dtype)) redops.push_back(RedOp::Avg);
  for (OpKind kind : {OpKind::Allreduce, OpKind::Reduce, OpKind::Broadcast, OpKind::Allgather,
                      OpKind::ReduceScatter}) {
    for (RedOp redop : redops) {
      if (!taiji::op_kind_reduces(kind) && redop != RedOp::Sum) continue;
      INFO(taiji::op_kind_name(kind) << " " << taiji::dtype_name(dtype) << " "
                                     << taiji::redop_name(redop) << " on " << n << " ranks");
      size_t send_n = kind == OpKind::ReduceScatter ? count * n : count;
      size_t recv_n = kind == OpKind::Allgather ? count * n : count;
      std::vector<T*> send(n), recv(n);
      std::vector<uint64_t> batch(n);
      for (int r = 0; r < n; ++r) {
        send[r] = static_cast<T*>(fake.alloc(send_n * sizeof(T)));
        recv[r] = static_cast<T*>(fake.alloc(recv_n * sizeof(T)));
        for (size_t i = 0; i < send_n; ++i) send[r][i] = input<T>(r, i);
        for (size_t i = 0; i < recv_n; ++i) recv[r][i] = sentinel;
        DeviceOp op{kind, dtype, redop, count, n - 1, send[r], recv[r], nullptr};
        batch[r] = launch(*comms[r], op);
      }
      for (int r = 0; r < n; ++r) REQUIRE(completes(*comms[r], batch[r], 2000));
      for (int r = 0; r < n; ++r) {
        std::vector<T> want(recv_n, sentinel);
        for (size_t i = 0; i < recv_n; ++i) {
          switch (kind) {
            case OpKind::Allreduce:
              want[i] = fold<T>(redop, n, i);
              break;
            case OpKind::Reduce:
              if (r == n - 1) want[i] = fold<T>(redop, n, i);
              break;
            case OpKind::Broadcast:
              want[i] = input<T>(n - 1, i);
              break;
            case OpKind::Allgather:
              want[i] = input<T>(static_cast<int>(i / count), i % count);
              break;
            case OpKind::ReduceScatter:
              want[i] = fold<T>(redop, n, r * count + i);
              break;
            default:
              break;
          }
        }
        CHECK(std::memcmp(recv[r], want.data(), recv_n * sizeof(T)) == 0);
      }
      for (int r = 0; r < n; ++r) {
        fake.release(send[r]);
        fake.release(recv[r]);
      }
    }
  }
  CHECK(fake.violations() == 0);
}

}  // namespace

TEST_CASE("fake device: every kind, dtype and operator computes NCCL's result", "[fake_device]") {
  for (int n : {1, 2, 3}) {
    check_results<float>(DType::F32, n);
    check_results<double>(DType::F64, n);
    check_results<int32_t>(DType::I32, n);
    check_results<int64_t>(DType::I64, n);
    check_results<uint8_t>(DType::U8, n);
    check_results<uint64_t>(DType::U64, n);
  }
}

TEST_CASE("fake device: in place, and a group of several ops", "[fake_device]") {
  FakeDeviceRuntime fake;
  const int n = 3;
  Comms comms = join_all(fake, n);
  std::vector<int32_t*> buf(n), gather(n);
  std::vector<uint64_t> batch(n);
  for (int r = 0; r < n; ++r) {
    buf[r] = static_cast<int32_t*>(fake.alloc(4 * sizeof(int32_t)));
    gather[r] = static_cast<int32_t*>(fake.alloc(2 * n * sizeof(int32_t)));
    for (int i = 0; i < 4; ++i) buf[r][i] = 10 * r + i;
    gather[r][2 * r] = 100 + r;
    gather[r][2 * r + 1] = 200 + r;
    auto b = comms[r]->launch({
        {OpKind::Allreduce, DType::I32, RedOp::Sum, 4, 0, buf[r], buf[r], nullptr},
        {OpKind::Allgather, DType::I32, RedOp::Sum, 2, 0, gather[r] + 2 * r, gather[r], nullptr},
    });
    REQUIRE(b.is_ok());
    batch[r] = b.value();
  }
  for (int r = 0; r < n; ++r) {
    REQUIRE(completes(*comms[r], batch[r], 2000));
    CHECK(std::vector<int32_t>(buf[r], buf[r] + 4) == std::vector<int32_t>{30, 33, 36, 39});
    CHECK(std::vector<int32_t>(gather[r], gather[r] + 2 * n) ==
          std::vector<int32_t>{100, 200, 101, 201, 102, 202});
    CHECK(fake.launched(r) ==
          std::vector<LaunchedOp>{{OpKind::Allreduce, 4}, {OpKind::Allgather, 2}});
  }
}

TEST_CASE("fake device: ranks that disagree are a violation that never completes",
          "[fake_device]") {
  FakeDeviceRuntime fake;
  Comms comms = join_all(fake, 2);
  auto* a = static_cast<float*>(fake.alloc(64 * sizeof(float)));
  auto* b = static_cast<float*>(fake.alloc(64 * sizeof(float)));
  DeviceOp op{OpKind::Allreduce, DType::F32, RedOp::Sum, 8, 0, a, a, nullptr};
  DeviceOp other = op;
  SECTION("count") { other.count = 16; }
  SECTION("dtype") { other.dtype = DType::I32; }
  SECTION("operator") { other.redop = RedOp::Max; }
  SECTION("kind") { other.kind = OpKind::Broadcast; }
  other.send = other.recv = b;
  uint64_t first = launch(*comms[0], op);
  launch(*comms[1], other);
  CHECK(fake.violations() == 1);
  CHECK(fake.violation_text().find("batch 0: rank 1 op 0") != std::string::npos);
  // Neither that batch nor any after it on the stream completes.
  uint64_t next = launch(*comms[0], op);
  launch(*comms[1], {OpKind::Allreduce, DType::F32, RedOp::Sum, 8, 0, b, b, nullptr});
  CHECK(fake.violations() == 1);
  CHECK_FALSE(completes(*comms[0], first, 50));
  CHECK_FALSE(completes(*comms[0], next, 10));
}

TEST_CASE("fake device: groups of different sizes are a violation", "[fake_device]") {
  FakeDeviceRuntime fake;
  Comms comms = join_all(fake, 2);
  auto* a = static_cast<float*>(fake.alloc(8 * sizeof(float)));
  DeviceOp op{OpKind::Allreduce, DType::F32, RedOp::Sum, 8, 0, a, a, nullptr};
  REQUIRE(comms[0]->launch({op, op}).is_ok());
  REQUIRE(comms[1]->launch({op}).is_ok());
  CHECK(fake.violations() == 1);
  CHECK(fake.violation_text() == "batch 0: rank 1 launched 1 ops, rank 0 2\n");
  CHECK_FALSE(completes(*comms[1], 0, 20));
}

TEST_CASE("fake device: memory places, and a runtime that is not usable", "[fake_device]") {
  FakeDeviceRuntime fake;
  CHECK(fake.usable().is_ok());
  auto* p = static_cast<char*>(fake.alloc(100));
  int host = 0;
  CHECK(fake.place(p).device);
  CHECK(fake.place(p).ordinal == 0);
  CHECK(fake.place(p + 99).device);
  CHECK_FALSE(fake.place(p + 100).device);
  CHECK_FALSE(fake.place(&host).device);
  Comms comms = join_all(fake, 1);
  // A host buffer, and a device buffer too small for the op, are refused at launch.
  CHECK(comms[0]
            ->launch({{OpKind::Allreduce, DType::F32, RedOp::Sum, 1, 0, &host, p, nullptr}})
            .status()
            .code() == Code::InvalidArgument);
  CHECK(comms[0]
            ->launch({{OpKind::Allreduce, DType::F32, RedOp::Sum, 26, 0, p, p, nullptr}})
            .status()
            .code() == Code::InvalidArgument);
  CHECK(comms[0]
            ->launch({{OpKind::Barrier, DType::F32, RedOp::Sum, 1, 0, p, p, nullptr}})
            .status()
            .code() == Code::Unsupported);
  fake.make_unusable("no GPU in this test");
  CHECK(fake.usable().code() == Code::NoDevice);
  CHECK(fake.usable().message() == "no GPU in this test");
  CHECK_FALSE(fake.place(p).device);
  CHECK(fake.create_comm(fake.make_id().value(), 0, 1, 0).status().code() == Code::NoDevice);
}

TEST_CASE("fake device: init waits for every rank and the slowest delay", "[fake_device]") {
  FakeDeviceRuntime fake;
  fake.init_delay_ms(1, 500);
  fake.fail_init(2, Status(Code::Internal, "injected init failure"));
  std::string id = fake.make_id().value();
  auto c0 = std::move(fake.create_comm(id, 0, 3, 0).value());
  CHECK(c0->init_status().code() == Code::InProgress);
  CHECK(c0->async_error().code() == Code::InProgress);
  auto joined = std::chrono::steady_clock::now();
  auto c1 = std::move(fake.create_comm(id, 1, 3, 0).value());
  CHECK(fake.create_comm(id, 1, 3, 0).status().code() == Code::InvalidArgument);
  CHECK(fake.create_comm(id, 0, 4, 0).status().code() == Code::InvalidArgument);
  CHECK(fake.create_comm("not made here", 0, 3, 0).status().code() == Code::InvalidArgument);
  auto c2 = std::move(fake.create_comm(id, 2, 3, 0).value());
  CHECK(c2->init_status().message() == "injected init failure");
  CHECK(c0->init_status().code() == Code::InProgress);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!c0->init_status().is_ok() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(std::chrono::steady_clock::now() - joined >= std::chrono::milliseconds(500));
  CHECK(c0->init_status().is_ok());
  CHECK(c1->init_status().is_ok());
  CHECK(c2->async_error().code() == Code::Internal);
}

TEST_CASE("fake device: hangs, async errors, device time and abort", "[fake_device]") {
  FakeDeviceRuntime fake;
  fake.hang_batch(1, 1);
  fake.async_error_after(0, 0, Status(Code::Io, "injected"));
  // Long enough that nothing completes before the first checks, even on a loaded host.
  fake.device_time_us(500000);
  Comms comms = join_all(fake, 2);
  auto* a = static_cast<float*>(fake.alloc(4 * sizeof(float)));
  DeviceOp op{OpKind::Allreduce, DType::F32, RedOp::Sum, 4, 0, a, a, nullptr};
  for (int k = 0; k < 3; ++k)
    for (auto& c : comms) launch(*c, op);
  CHECK(comms[0]->done(0).value() == false);
  CHECK(comms[0]->async_error().is_ok());
  REQUIRE(completes(*comms[0], 0, 3000));
  CHECK(comms[0]->async_error().message() == "injected");
  CHECK(comms[1]->async_error().is_ok());
  // Batch 1 hangs, and batch 2 behind it on the stream.
  CHECK_FALSE(completes(*comms[1], 1, 100));
  CHECK_FALSE(completes(*comms[1], 2, 10));
  comms[1]->abort();
  comms[1]->abort();
  CHECK(fake.aborts() == 1);
  CHECK(comms[1]->done(1).status().code() == Code::Aborted);
  CHECK(comms[1]->launch({op}).status().code() == Code::Aborted);
  CHECK(comms[0]->done(1).value() == false);
}

TEST_CASE("fake device: finalize waits for every rank, or times out and aborts", "[fake_device]") {
  FakeDeviceRuntime fake;
  Comms comms = join_all(fake, 3);
  Status st[3];
  SECTION("every rank") {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) threads.emplace_back([&, r] { st[r] = comms[r]->finalize(5000); });
    for (auto& t : threads) t.join();
    for (const Status& s : st) CHECK(s.is_ok());
    CHECK(fake.aborts() == 0);
  }
  SECTION("rank 2 never finalizes") {
    auto start = std::chrono::steady_clock::now();
    std::thread t([&] { st[0] = comms[0]->finalize(150); });
    st[1] = comms[1]->finalize(150);
    t.join();
    auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= std::chrono::milliseconds(150));
    CHECK(took < std::chrono::milliseconds(1150));
    CHECK(st[0].code() == Code::Timeout);
    CHECK(st[1].message().find("ranks not finalizing: 2") != std::string::npos);
    CHECK(fake.aborts() == 2);
  }
}

TEST_CASE("fake device: fences record a stream's position; a launch needs its fence held", "[fake_device]") {
  FakeDeviceRuntime fake;
  Comms comms = join_all(fake, 1);
  void* stream = fake.make_stream();
  auto* buf = static_cast<float*>(fake.alloc(4 * sizeof(float)));
  CHECK(fake.queue_work(stream, 2) == 2);
  auto fence = fake.record_fence(stream, 0);
  REQUIRE(fence.is_ok());
  CHECK(fence.value() != 0);
  CHECK(fake.queue_work(stream, 5) == 7);
  DeviceOp op{OpKind::Allreduce, DType::F32, RedOp::Sum, 4, 0, buf, buf, stream, fence.value()};
  launch(*comms[0], op);
  fake.release_fence(fence.value());
  // Without a fence an op waits for the stream as it is at the launch.
  op.fence = 0;
  launch(*comms[0], op);
  auto waits = fake.fence_waits(0);
  REQUIRE(waits.size() == 2);
  CHECK((waits[0].fenced && waits[0].stream == stream && waits[0].position == 2));
  CHECK((!waits[1].fenced && waits[1].stream == stream && waits[1].position == 7));
  // A released fence, another stream's fence, an unknown stream, another device: refused.
  op.fence = fence.value();
  CHECK(comms[0]->launch({op}).status().code() == Code::InvalidArgument);
  auto other = fake.record_fence(nullptr, 0);
  REQUIRE(other.is_ok());
  op.fence = other.value();
  CHECK(comms[0]->launch({op}).status().code() == Code::InvalidArgument);
  int not_a_stream = 0;
  CHECK(fake.record_fence(&not_a_stream, 0).status().code() == Code::InvalidArgument);
  CHECK(fake.record_fence(stream, 1).status().code() == Code::InvalidArgument);
  CHECK(fake.fences_recorded() == 2);
  CHECK(fake.fences_held() == 1);
  fake.release_fence(other.value());
  fake.release_fence(other.value());
  fake.release_fence(0);
  CHECK(fake.fences_held() == 0);
  CHECK(fake.stray_fence_releases() == 1);
  CHECK(fake.fence_waits(0).size() == 2);
  fake.release(buf);
}
