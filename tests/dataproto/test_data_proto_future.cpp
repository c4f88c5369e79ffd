#include <hyflow/dataproto/data_proto_future.hpp>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <atomic>
#include <thread>

using hyflow::DataProto;
using hyflow::DataProtoFuture;
using hyflow::TensorDict;

namespace {
DataProto rows(int64_t from, int64_t to) {
  return DataProto(TensorDict{{"ids", torch::arange(from, to, torch::kLong)}});
}
std::vector<int64_t> ids_of(const DataProto& d) {
  auto t = d.batch.at("ids").contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}
}  // namespace

TEST_CASE("a future concatenates its parts in order once they arrive") {
  std::promise<DataProto> p0, p1;
  DataProtoFuture f({p0.get_future().share(), p1.get_future().share()});
  CHECK_FALSE(f.is_ready());
  CHECK_FALSE(f.wait_for(std::chrono::milliseconds(1)));
  std::thread producer([&] {
    p1.set_value(rows(2, 4));
    p0.set_value(rows(0, 2));
  });
  CHECK(ids_of(f.get()) == std::vector<int64_t>{0, 1, 2, 3});
  producer.join();
  CHECK(f.is_ready());
}

TEST_CASE("the transform runs once; later gets share the cached result") {
  std::atomic<int> calls{0};
  std::promise<DataProto> p;
  p.set_value(rows(0, 6));
  DataProtoFuture f({p.get_future().share()}, [&calls](DataProto d) {
                      ++calls;
                      return hyflow::unpad_dataproto(d, 2);  // e.g. un-padding after a dispatch
                    });
  auto a = f.get();
  auto b = f.get();
  CHECK(calls == 1);
  CHECK(ids_of(a) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(a.batch.at("ids").data_ptr() == b.batch.at("ids").data_ptr());
}

TEST_CASE("chunk gives lazy futures of the pieces and concatenates the parent once") {
  std::promise<DataProto> p0, p1;
  std::atomic<int> parent_calls{0};
  DataProtoFuture f({p0.get_future().share(), p1.get_future().share()}, [&](DataProto d) {
    ++parent_calls;
    return d;
  });
  auto pieces = f.chunk(3);
  REQUIRE(pieces.size() == 3);
  CHECK_FALSE(pieces[1].is_ready());
  p0.set_value(rows(0, 3));
  CHECK_FALSE(pieces[1].is_ready());
  p1.set_value(rows(3, 6));
  CHECK(pieces[1].is_ready());
  CHECK(ids_of(pieces[1].get()) == std::vector<int64_t>{2, 3});
  CHECK(ids_of(pieces[2].get()) == std::vector<int64_t>{4, 5});
  CHECK(ids_of(pieces[0].get()) == std::vector<int64_t>{0, 1});
  CHECK(parent_calls == 1);
}

TEST_CASE("map chains a lazy transform after the parent's") {
  auto f = DataProtoFuture::ready(rows(0, 4)).map([](DataProto d) { return d.slice(1, 3); });
  CHECK(ids_of(f.get()) == std::vector<int64_t>{1, 2});
}

TEST_CASE("then runs its continuation when the promise is set, on the setting thread, without a get") {
  hyflow::DataProtoPromise promise;
  std::atomic<int> transformed{0};
  std::vector<int64_t> seen;
  std::thread::id ran_on;
  auto sliced = promise.get_future().then([&](DataProto d) {
    ++transformed;
    return d.slice(1, 3);
  });
  sliced.then(
      [&](DataProto d) {
        seen = ids_of(d);
        ran_on = std::this_thread::get_id();
      },
      [](std::exception_ptr) {});
  CHECK(transformed == 0);
  std::thread producer([&] { promise.set_value(rows(0, 4)); });
  const auto producer_id = producer.get_id();
  producer.join();
  CHECK(transformed == 1);
  CHECK(seen == std::vector<int64_t>{1, 2});
  CHECK(ran_on == producer_id);
  CHECK(sliced.is_ready());
}

TEST_CASE("a continuation added to a complete future runs at once; failures go to the error handler") {
  std::vector<int64_t> seen;
  DataProtoFuture::ready(rows(0, 2)).then([&](DataProto d) { seen = ids_of(d); }, [](std::exception_ptr) {});
  CHECK(seen == std::vector<int64_t>{0, 1});

  hyflow::DataProtoPromise promise;
  std::string error;
  auto next = promise.get_future().then([](DataProto d) { return d; });
  next.then([](DataProto) {},
            [&](std::exception_ptr e) {
              try {
                std::rethrow_exception(e);
              } catch (const std::exception& x) {
                error = x.what();
              }
            });
  promise.set_exception(std::make_exception_ptr(hyflow::Error("rank 0 failed")));
  CHECK(error == "rank 0 failed");
  CHECK_THROWS_WITH(next.get(), "rank 0 failed");
  CHECK_FALSE(promise.set_value(rows(0, 1)));  // settled once
}

TEST_CASE("then on a future of std::shared_future parts fires when the parts arrive") {
  std::promise<DataProto> p0, p1;
  DataProtoFuture f({p0.get_future().share(), p1.get_future().share()});
  std::promise<std::vector<int64_t>> seen;
  f.then([&](DataProto d) { seen.set_value(ids_of(d)); }, [&](std::exception_ptr) { seen.set_value({}); });
  p0.set_value(rows(0, 1));
  p1.set_value(rows(1, 3));
  CHECK(seen.get_future().get() == std::vector<int64_t>{0, 1, 2});
}

TEST_CASE("a failed part rethrows its exception from get, also through chunks") {
  std::promise<DataProto> p;
  DataProtoFuture f({p.get_future().share()});
  auto pieces = f.chunk(2);
  p.set_exception(std::make_exception_ptr(hyflow::Error("rank 1 failed in update_actor")));
  CHECK_THROWS_WITH(f.get(), Catch::Contains("rank 1 failed"));
  CHECK_THROWS_WITH(pieces[0].get(), Catch::Contains("rank 1 failed"));
}

TEST_CASE("empty futures and invalid parts are errors") {
  DataProtoFuture empty;
  CHECK_FALSE(empty.valid());
  CHECK_THROWS_AS(empty.get(), hyflow::ValueError);
  CHECK_THROWS_AS(empty.chunk(2), hyflow::ValueError);
  CHECK_THROWS_AS(DataProtoFuture(std::vector<DataProtoFuture::Part>{}), hyflow::ValueError);
  CHECK_THROWS_AS(DataProtoFuture({std::shared_future<DataProto>()}), hyflow::ValueError);
  CHECK_THROWS_AS(DataProtoFuture::ready(rows(0, 2)).chunk(0), hyflow::ValueError);
}

TEST_CASE("a chunk index beyond torch.chunk's pieces is an error naming it") {
  auto d = rows(0, 2);
  d.meta_info[hyflow::dataproto::kAutoPaddingKey] = true;
  auto pieces = DataProtoFuture::ready(d).chunk(4);  // 2 rows into 4: only 2 pieces exist
  CHECK(ids_of(pieces[1].get()) == std::vector<int64_t>{1});
  CHECK_THROWS_WITH(pieces[3].get(), Catch::Contains("chunk 3 of 4"));
}
