#include "runtime/base/bounded_queue.hpp"

#include <doctest/doctest.h>

#include <thread>

using namespace rlsync;
using std::chrono::steady_clock;

TEST_CASE("bounded_queue refuses beyond capacity and keeps FIFO order") {
  bounded_queue<int> q(2);
  CHECK(q.try_push(1));
  CHECK(q.try_push(2));
  CHECK(!q.try_push(3));
  CHECK(q.size() == 2);
  CHECK(q.try_pop() == 1);
  CHECK(q.try_push(3));
  CHECK(q.try_pop() == 2);
  CHECK(q.try_pop() == 3);
  CHECK(!q.try_pop());
}

TEST_CASE("bounded_queue: a wait with a past deadline returns at once, empty") {
  bounded_queue<int> q(1);
  CHECK(!q.pop_until(steady_clock::now()));
}

TEST_CASE("bounded_queue: close wakes a waiting consumer, refuses pushes and drains") {
  bounded_queue<int> q(4);
  CHECK(q.try_push(7));
  std::optional<int> first, second;
  std::thread consumer([&] {
    first = q.pop_until(steady_clock::now() + std::chrono::hours(1));
    second = q.pop_until(steady_clock::now() + std::chrono::hours(1));
  });
  q.close(); // the second pop must not wait an hour
  consumer.join();
  CHECK(first == 7);
  CHECK(!second);
  CHECK(!q.try_push(8));
  CHECK(q.closed());
}

TEST_CASE("bounded_queue hands items across threads") {
  bounded_queue<int> q(8);
  long sum = 0;
  std::thread consumer([&] {
    for (int n = 0; n < 1000;)
      if (auto x = q.pop_until(steady_clock::now() + std::chrono::seconds(10))) {
        sum += *x;
        ++n;
      }
  });
  for (int i = 1; i <= 1000;)
    if (q.try_push(i))
      ++i;
    else
      std::this_thread::yield(); // full: the consumer will make room
  consumer.join();
  CHECK(sum == 500500);
}
