#include <hyflow/dataproto/data_proto.hpp>
#include <hyflow/dataproto/serialization.hpp>

#include <ATen/ATen.h>

#include <iostream>

int main() {
  hyflow::DataProto batch(hyflow::TensorDict{{"x", at::arange(12).reshape({6, 2})}});
  auto back = hyflow::dataproto::deserialize(hyflow::dataproto::serialize(hyflow::DataProto::concat(batch.chunk(3))));
  if (!at::equal(back.batch.at("x"), batch.batch.at("x"))) {
    std::cerr << "consumer_dataproto: round trip changed the data\n";
    return 1;
  }
  std::cout << "consumer_dataproto: ok (" << back.info() << ")\n";
  return 0;
}
