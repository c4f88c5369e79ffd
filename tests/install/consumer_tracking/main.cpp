// Logs one step through an installed hyflow's Tracking, with the console tracker.
#include <hyflow/tracking/tracking.hpp>

#include <iostream>

int main() {
  hyflow::tracking::Tracking tracking({"console"}, hyflow::tracking::RunInfo{.total_steps = 1});
  tracking.log({{"critic/score/mean", 1.0}}, 1);
  tracking.close();
  std::cout << "consumer_tracking: ok\n";
  return 0;
}
